"""A small Python client for the idempotency sidecar (docs/spec.md#api).

Wrap a business write in `idempotent(...)`:

    with idempotent(stub, key, request_hash) as attempt:
        if not attempt.acquired:
            return attempt.result  # replay, or see attempt.outcome
        payment = write_payment(..., fencing_token=attempt.fencing_token)
        attempt.complete(code=201, body=payment.json(), content_type="application/json")

Only an ACQUIRED attempt writes. Raise BusinessError to record a failure
(replayed later unless retryable). Any other exception reports nothing: the
write may or may not have happened, so the lease runs out and the sidecar's
expiry policy decides (UNKNOWN by default) instead of a silent re-execution.

The gRPC stubs are generated from proto/ by run.sh; they must be importable.
"""

import contextlib

from idempotency.v1 import idempotency_pb2 as pb
from idempotency.v1 import idempotency_pb2_grpc as pb_grpc

__all__ = ["pb", "pb_grpc", "Attempt", "BusinessError", "idempotent", "snapshot"]


def snapshot(code, body, content_type="", headers=None):
    """Returns a Snapshot: an HTTP status (or gRPC code) and the response bytes."""
    if isinstance(body, str):
        body = body.encode("utf-8")
    return pb.Snapshot(code=code, body=body, content_type=content_type, headers=headers or {})


class BusinessError(Exception):
    """A business failure to record with Fail instead of a result."""

    def __init__(self, error, retryable=False):
        super().__init__(f"business error {error.code}")
        self.error = error  # a Snapshot, replayed to later Begins unless retryable
        self.retryable = retryable


class Attempt:
    """The answer of Begin, and the holder's calls when it was ACQUIRED."""

    def __init__(self, stub, key, response, timeout):
        self._stub = stub
        self._key = key
        self._timeout = timeout
        self.outcome = response.outcome
        self.record = response.record
        self.fencing_token = response.fencing_token
        self.retry_after = response.retry_after.ToTimedelta()
        self.reported = False

    @property
    def acquired(self):
        return self.outcome == pb.OUTCOME_ACQUIRED

    @property
    def outcome_name(self):
        return pb.Outcome.Name(self.outcome)

    @property
    def result(self):
        """The stored snapshot to replay (COMPLETED or FAILED), else None."""
        if self.outcome in (pb.OUTCOME_COMPLETED, pb.OUTCOME_FAILED):
            return self.record.result
        return None

    def heartbeat(self, extend_seconds=None):
        """Extends the lease while a slow write is running."""
        request = pb.HeartbeatRequest(key=self._key, fencing_token=self.fencing_token)
        if extend_seconds is not None:
            request.extend.FromSeconds(extend_seconds)
        return self._stub.Heartbeat(request, timeout=self._timeout).lease_expires_at

    def complete(self, code, body, content_type="", headers=None):
        """Stores the result; every later Begin with the same hash replays it."""
        request = pb.CompleteRequest(
            key=self._key,
            fencing_token=self.fencing_token,
            result=snapshot(code, body, content_type, headers),
        )
        self.record = self._stub.Complete(request, timeout=self._timeout).record
        self.reported = True
        return self.record

    def fail(self, error, retryable=False):
        """Stores a business error (a Snapshot)."""
        request = pb.FailRequest(
            key=self._key, fencing_token=self.fencing_token, error=error, retryable=retryable
        )
        self.record = self._stub.Fail(request, timeout=self._timeout).record
        self.reported = True
        return self.record


@contextlib.contextmanager
def idempotent(stub, key, request_hash, lease_seconds=30, timeout=5.0):
    """Begins an attempt for `key` (a RecordKey) and yields it as an Attempt.

    gRPC errors (e.g. UNAVAILABLE) propagate: retry later with the same key.
    """
    request = pb.BeginRequest(key=key, request_hash=request_hash)
    request.lease.FromSeconds(lease_seconds)
    attempt = Attempt(stub, key, stub.Begin(request, timeout=timeout), timeout)
    try:
        yield attempt
    except BusinessError as e:
        if attempt.acquired and not attempt.reported:
            attempt.fail(e.error, e.retryable)
        raise
    if attempt.acquired and not attempt.reported:
        # A bug in the caller: without Complete/Fail the record ends UNKNOWN.
        raise RuntimeError("acquired attempt finished without complete() or fail()")
