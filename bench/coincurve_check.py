"""Cross-check NeuroShard signatures against libsecp256k1 (via PyPI coincurve).

1. Verify every signature Rust made (over canonical proof bytes and other messages).
2. Re-sign the same messages with the same test keys: RFC 6979 + low-S means libsecp256k1
   must produce byte-identical signatures.
3. Sign fresh messages with fresh keys in Python, plus negative cases (malleated high-S
   twin, wrong message, wrong key), and write them for Rust to verify.
"""
import hashlib
import json
import os
import sys

import coincurve

N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141


def der_int(x: int) -> bytes:
    b = x.to_bytes(32, "big").lstrip(b"\x00") or b"\x00"
    if b[0] & 0x80:
        b = b"\x00" + b
    return b"\x02" + bytes([len(b)]) + b


def compact_to_der(sig: bytes) -> bytes:
    body = der_int(int.from_bytes(sig[:32], "big")) + der_int(int.from_bytes(sig[32:], "big"))
    return b"\x30" + bytes([len(body)]) + body


def der_to_compact(der: bytes) -> bytes:
    assert der[0] == 0x30
    i = 2
    out = b""
    for _ in range(2):
        assert der[i] == 0x02
        n = der[i + 1]
        out += int.from_bytes(der[i + 2 : i + 2 + n], "big").to_bytes(32, "big")
        i += 2 + n
    return out


def verify(pub: bytes, msg: bytes, sig: bytes) -> bool:
    try:
        return coincurve.PublicKey(pub).verify(compact_to_der(sig), msg, hasher=lambda m: hashlib.sha256(m).digest())
    except Exception:
        return False


def main(rust_vectors: str, py_out: str) -> int:
    sha = lambda m: hashlib.sha256(m).digest()
    ok = bad = same = differ = 0
    msgs = []
    with open(rust_vectors) as f:
        for line in f:
            v = json.loads(line)
            pub, msg, sig = bytes.fromhex(v["pubkey"]), bytes.fromhex(v["msg"]), bytes.fromhex(v["sig"])
            msgs.append(msg)
            if verify(pub, msg, sig):
                ok += 1
            else:
                bad += 1
            key = coincurve.PrivateKey(bytes.fromhex(v["secret"]))
            assert key.public_key.format(compressed=True) == pub, "public key derivation differs"
            mine = der_to_compact(key.sign(msg, hasher=sha))
            if mine == sig:
                same += 1
            else:
                differ += 1
    print(f"coincurve verified rust signatures: {ok} ok, {bad} failed")
    print(f"deterministic re-sign (RFC 6979): {same} byte-identical, {differ} different")

    cases = []
    for i, msg in enumerate(msgs[:32] + [os.urandom(n) for n in (0, 1, 31, 32, 33, 1000)]):
        key = coincurve.PrivateKey()
        other = coincurve.PrivateKey()
        pub = key.public_key.format(compressed=True)
        sig = der_to_compact(key.sign(msg, hasher=sha))
        r, s = sig[:32], int.from_bytes(sig[32:], "big")
        assert s <= N // 2, "libsecp256k1 signs low-S"
        high = r + (N - s).to_bytes(32, "big")
        cases.append({"pubkey": pub.hex(), "msg": msg.hex(), "sig": sig.hex(), "expect": True, "note": f"py-{i}"})
        cases.append({"pubkey": pub.hex(), "msg": msg.hex(), "sig": high.hex(), "expect": False, "note": f"high-s-{i}"})
        cases.append({"pubkey": pub.hex(), "msg": (msg + b"x").hex(), "sig": sig.hex(), "expect": False, "note": f"wrong-msg-{i}"})
        cases.append({"pubkey": other.public_key.format(compressed=True).hex(), "msg": msg.hex(), "sig": sig.hex(), "expect": False, "note": f"wrong-key-{i}"})
        # libsecp256k1 itself refuses the high-S twin too.
        assert not verify(pub, msg, high)
    with open(py_out, "w") as f:
        for c in cases:
            f.write(json.dumps(c) + "\n")
    print(f"python wrote {len(cases)} vectors ({len(cases) // 4} valid, {3 * len(cases) // 4} invalid)")
    return 0 if bad == 0 and differ == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
