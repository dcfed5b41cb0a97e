"""Applied migrations are never edited (issue 23): ``migrations/applied.sha256`` holds the
sha256 of every file of every revision (``sha256sum -c migrations/applied.sha256`` checks it
from the repository's root), and ``migrations/schema.sql`` is at the head revision."""

from __future__ import annotations

import hashlib
from pathlib import Path

from allocator.local import schema_snapshot
from allocator.postgres import migrate

ROOT = migrate.MIGRATIONS_DIR.parent
MANIFEST = migrate.MIGRATIONS_DIR / "applied.sha256"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def revision_files() -> list[str]:
    """Every revision's files, as paths from the repository's root."""
    versions = migrate.MIGRATIONS_DIR.glob("versions/[0-9][0-9][0-9][0-9]_*.py")
    sql = migrate.SQL_DIR.glob("[0-9][0-9][0-9][0-9]/*.sql")
    return sorted(path.relative_to(ROOT).as_posix() for path in [*versions, *sql])


def manifest() -> dict[str, str]:
    """``path: sha256`` from the manifest (``sha256sum``'s format: digest, two spaces, path)."""
    lines = MANIFEST.read_text(encoding="utf-8").splitlines()
    return {path: digest for digest, path in (line.split("  ", 1) for line in lines if line)}


def test_no_applied_migration_is_edited() -> None:
    changed = [
        path
        for path, digest in manifest().items()
        if not (ROOT / path).is_file() or sha256(ROOT / path) != digest
    ]
    assert not changed, (
        f"applied migrations changed: {changed}. A database past a revision never runs it "
        "again, so an edit reaches no existing database: put it back as it was and add a new "
        "revision (migrations/versions/NNNN_*.py, migrations/sql/NNNN/) that makes the change "
        "(expand-only: docs/sql.md), then `make schema-snapshot`."
    )


def test_every_revision_file_is_in_the_manifest() -> None:
    listed = manifest()
    missing = [path for path in revision_files() if path not in listed]
    lines = "\n".join(f"{sha256(ROOT / path)}  {path}" for path in missing)
    assert not missing, (
        "a new revision's files go into migrations/applied.sha256 in the change that adds "
        f"them (a revision is final once merged); append:\n{lines}"
    )


def test_the_snapshot_is_at_the_head_revision() -> None:
    first_line = schema_snapshot.SNAPSHOT.read_text(encoding="utf-8").splitlines()[0]
    assert first_line.endswith(f"at revision {migrate.head_revision()}."), (
        "migrations/schema.sql is behind the migrations: run `make schema-snapshot`"
    )
