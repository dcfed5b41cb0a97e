"""Fixture plugins shared by every test folder (servers start only when a test asks)."""

pytest_plugins = ["tests.fixtures.cluster", "tests.fixtures.pg", "tests.fixtures.zk"]
