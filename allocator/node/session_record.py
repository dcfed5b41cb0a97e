"""The node's session file: every new session kept, the file gone at a clean exit, a dead
predecessor's session reaped at start.

Only with ``node.state_dir`` set; the folder is checked before anything else starts (a bad
one is a configuration error, exit 78).
"""

from __future__ import annotations

from pathlib import Path

from allocator.config import Config
from allocator.core import logs
from allocator.session import file as session_file
from allocator.session import reaper

log = logs.get_logger(__name__)


class SessionRecorder:
    """The node's side of :mod:`allocator.session.file` and :mod:`allocator.session.reaper`."""

    def __init__(self, config: Config, name: str, host: str, pid: int) -> None:
        self._config = config
        self._name = name
        self._host = host
        self._pid = pid
        self._state_dir: Path | None = config.node.state_path()
        self._ready = False  # the folder passed session_file.prepare

    def prepare(self) -> None:
        """At start: check the folder (``ConfigError``), then reap a dead predecessor."""
        if self._state_dir is None:
            return
        session_file.prepare(self._state_dir)
        self._ready = True
        self._reap_predecessor()

    def _reap_predecessor(self) -> None:
        """Close the session a dead predecessor of this name left, so the election does not
        wait for ZooKeeper to expire it. Only with a stable name."""
        assert self._state_dir is not None
        if not self._config.node.name:
            log.info(
                "session_reap_skipped",
                name=self._name,
                reason="node.name is not set: the default <hostname>-<pid> changes at every "
                "start, so a dead predecessor cannot be recognised (set node.name to reap)",
            )
            return
        reaper.reap(
            self._state_dir,
            reaper.self_of(self._config, self._host),
            timeout_s=self._config.zookeeper.connect_timeout_s,
        )

    def record(self, client_id: tuple[int, bytes] | None) -> None:
        """Keep a new session's id and password in the session file."""
        if self._state_dir is None or not self._ready or client_id is None:
            return
        record = session_file.SessionRecord(
            name=self._name,
            host=self._host,
            pid=self._pid,
            zookeeper_hosts=self._config.zookeeper.hosts,
            session_id=client_id[0],
            session_password=client_id[1],
            election_path=self._config.zookeeper.election_path,
            start_time=reaper.own_start_time(self._pid),
            boot_id=reaper.boot_id(),
            pid_namespace=reaper.pid_namespace(),
        )
        try:
            path = session_file.write(self._state_dir, record, hold=True)
        except OSError as exc:
            # The node can do its job without it; only a later clean-up of this session
            # from outside cannot. Remove a file of ours naming an older session.
            log.error(
                "session_file_failed",
                name=self._name,
                dir=self._state_dir,
                error=exc.strerror or str(exc),
            )
            self.forget()
            return
        log.info("session_recorded", name=self._name, session_id=f"{client_id[0]:#x}", path=path)

    def forget(self) -> None:
        """Remove the session file this process wrote (one another process wrote since is
        not this node's to remove), then let go of the state folder's lock."""
        if self._state_dir is None or not self._ready:
            return
        me = (self._pid, reaper.own_start_time(self._pid), reaper.pid_namespace())

        def written_by_me(record: session_file.SessionRecord) -> bool:
            return (record.pid, record.start_time, record.pid_namespace) == me

        try:
            session_file.remove(self._state_dir, only_if=written_by_me)
        except OSError as exc:
            log.warning(
                "session_file_remove_failed",
                name=self._name,
                dir=self._state_dir,
                error=exc.strerror or str(exc),
            )
        finally:
            session_file.release(self._state_dir)
