"""Walks through one idempotency record against a running sidecar.

Usage: walkthrough.py HOST:PORT

Begin with a fresh key (ACQUIRED), Complete with a JSON snapshot, Begin again
(COMPLETED, the same bytes replayed), Begin with another request hash
(MISMATCH, no result). Exits 0 only if every answer is the one
docs/spec.md#transitions prescribes; 1 otherwise; 2 on bad usage.
"""

import hashlib
import json
import sys
import uuid

import grpc

from idempotency_client import idempotent, pb, pb_grpc


def request_hash(request):
    """SHA-256 of the request in canonical JSON (sorted keys, no spaces)."""
    canonical = json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).digest()


def check(ok, what):
    print(("  ok    " if ok else "  FAIL  ") + what)
    if not ok:
        sys.exit(1)


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    stub = pb_grpc.IdempotencyStub(grpc.insecure_channel(argv[1]))
    key = pb.RecordKey(tenant="examples", operation="create-payment", key=f"py-{uuid.uuid4()}")
    request = {"amount_minor": 1250, "currency": "EUR", "payee": "Zürich Café AG"}
    print(f"sidecar {argv[1]}, record {key.tenant}/{key.operation}/{key.key}")

    # The response we will store; non-ASCII on purpose, replays must be byte-exact.
    payment_id = f"pay_{uuid.uuid4().hex[:12]}"
    body = json.dumps({"payment_id": payment_id, **request}, ensure_ascii=False).encode("utf-8")
    headers = {"location": f"/payments/{payment_id}"}

    print("1. Begin with a fresh key")
    with idempotent(stub, key, request_hash(request)) as attempt:
        check(attempt.acquired, f"outcome {attempt.outcome_name}, want OUTCOME_ACQUIRED")
        check(attempt.fencing_token == 1, f"fencing token {attempt.fencing_token}, want 1")
        print(f"2. write payment {payment_id} (token {attempt.fencing_token}), then Complete")
        record = attempt.complete(201, body, "application/json", headers)
        check(record.status == pb.STATUS_SUCCEEDED, f"status {pb.Status.Name(record.status)}")

    print("3. Begin again with the same request: a replay")
    with idempotent(stub, key, request_hash(request)) as attempt:
        check(attempt.outcome == pb.OUTCOME_COMPLETED, f"outcome {attempt.outcome_name}")
        replay = attempt.result
        check(replay.body == body, f"body replayed byte for byte ({len(replay.body)} bytes)")
        check(replay.code == 201, f"code {replay.code}")
        check(replay.content_type == "application/json", f"content type {replay.content_type!r}")
        check(dict(replay.headers) == headers, f"headers {dict(replay.headers)}")
        print(f"        {replay.body.decode('utf-8')}")

    print("4. Begin with the same key but another request")
    other = dict(request, amount_minor=9999)
    with idempotent(stub, key, request_hash(other)) as attempt:
        check(attempt.outcome == pb.OUTCOME_MISMATCH, f"outcome {attempt.outcome_name}")
        check(not attempt.record.HasField("result"), "no result snapshot on MISMATCH")

    print("all steps behaved as docs/spec.md says")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except grpc.RpcError as e:
        print(f"  FAIL  gRPC error {e.code().name}: {e.details()}", file=sys.stderr)
        sys.exit(1)
