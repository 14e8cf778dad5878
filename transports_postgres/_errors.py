"""Translating psycopg errors into `TransportError`s that name the queue, never a password.

    psycopg / psycopg_pool error                 what the caller gets
    ├── PoolTimeout (no connection in time)      TransportError: server unreachable or pool full
    ├── connection lost before anything was sent TransportError: the call did nothing
    ├── connection lost mid-call                 OutcomeUnknown for a call that writes
    │                                            (publish, ack, ...), TransportError for a read
    ├── UndefinedTable                           TransportError: the queue's schema is gone
    ├── a prepared statement that already exists TransportError: a pooler in transaction
    │   or does not exist (psycopg's, _pg3_*)    mode is in the way; set prepare_threshold=none
    ├── within, the connection lost              TransportError: the caller's transaction
    │                                            is gone, nothing of it committed
    ├── within, a serialization failure or       TransportError: roll back and run the
    │   deadlock, or a key stored after the      caller's transaction again
    │   caller's snapshot was taken
    └── other DatabaseError (not a bug of ours)  TransportError with the server's message

Programming errors (a syntax error would be ours) pass through. Used by both runners;
imports psycopg only for its exception classes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import ClassVar

import psycopg
from psycopg import errors as pgerrors
from psycopg_pool import PoolClosed, PoolTimeout

from transports_core import OutcomeUnknown, TransportError


def unreachable(where: str, exc: psycopg.OperationalError) -> TransportError:
    """The error of a first connection that failed: libpq's first line names the host
    and port and says why (refused, unknown host, bad password, no such database)."""
    text = str(exc).strip()
    reason = text.splitlines()[0] if text else type(exc).__name__
    return TransportError(f"{where}: cannot connect: {reason}")


class Call:
    """What `postgres_errors` needs to know of the call in flight: its name, whether it
    writes, and whether any statement has been sent yet (the runner sets ``sent``)."""

    __slots__ = ("name", "sent", "writes")
    # Whether it runs in a transaction of the caller's (see `JoinedCall`).
    joined: ClassVar[bool] = False

    def __init__(self, name: str, writes: bool) -> None:
        self.name, self.writes, self.sent = name, writes, False


class JoinedCall(Call):
    """A call of ``within``: it runs in the caller's transaction, which it never commits."""

    __slots__ = ()
    joined = True


def _lost(exc: psycopg.Error) -> bool:
    """True if the connection broke (not a statement that failed on a healthy one)."""
    if isinstance(exc, (pgerrors.AdminShutdown, pgerrors.CrashShutdown)):
        return True
    sqlstate = exc.sqlstate or ""
    return isinstance(exc, psycopg.OperationalError) and (not sqlstate or sqlstate[:2] == "08")


@contextmanager
def postgres_errors(where: str, call: Call) -> Iterator[None]:
    try:
        yield
    except PoolClosed as exc:
        raise TransportError(f"{where}: {call.name}: the transport is closed") from exc
    except PoolTimeout as exc:
        raise TransportError(
            f"{where}: {call.name}: no connection to the server within the pool timeout "
            f"(server unreachable, or every pooled connection busy): {exc}"
        ) from exc
    except psycopg.Error as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if _lost(exc):
            if call.joined:
                raise TransportError(
                    f"{where}: {call.name} within: the connection was lost ({reason}); your "
                    "transaction went with it, so nothing of it was committed"
                ) from exc
            if call.sent and call.writes:
                raise OutcomeUnknown(f"{where}: {call.name}", reason) from exc
            raise TransportError(
                f"{where}: {call.name}: the connection was lost ({reason}); nothing was "
                "changed, and the next call reconnects"
            ) from exc
        if isinstance(exc, pgerrors.UndefinedTable):
            raise TransportError(
                f"{where}: the queue's tables are gone (was its schema dropped?): {reason}"
            ) from exc
        if isinstance(exc, _PREPARED):
            # Only psycopg prepares here: the server connection under this client connection
            # changed between two transactions, as a pooler in transaction mode does.
            fix = (
                "on your connection (prepare_threshold=None)"
                if call.joined
                else "by adding prepare_threshold=none to the URL"
            )
            raise TransportError(
                f"{where}: {call.name}: {reason}: the connection goes through a pooler in "
                "transaction mode (PgBouncer?), which hands each transaction to any server "
                f"connection, so statements prepared on one are unknown on the next; turn "
                f"psycopg's prepared statements off {fix}"
            ) from exc
        if isinstance(exc, psycopg.ProgrammingError) and not isinstance(
            exc, pgerrors.InsufficientPrivilege
        ):
            raise
        if call.joined and (
            isinstance(exc, (pgerrors.SerializationFailure, pgerrors.DeadlockDetected))
            or _late_key(exc)
        ):
            raise TransportError(
                f"{where}: {call.name} within: {reason}; roll your transaction back and run "
                "it again"
            ) from exc
        raise TransportError(f"{where}: {call.name}: PostgreSQL error: {reason}") from exc


_PREPARED = (pgerrors.DuplicatePreparedStatement, pgerrors.InvalidSqlStatementName)


def _late_key(exc: psycopg.Error) -> bool:
    """Whether ``exc`` is a key's INSERT that met a key committed after the caller's
    snapshot (repeatable read or serializable), which that snapshot could not see: a
    serialization failure in all but its code (see `sql.APPEND_MANY_NEW_KEYS`)."""
    return isinstance(exc, pgerrors.UniqueViolation) and exc.diag.constraint_name == "keys_pkey"
