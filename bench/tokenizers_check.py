"""Cross-check our tokenizer.json and shards against the Python `tokenizers` library (PyPI).

Modes:
  samples CORPUS_DIR OUT_JSONL [N]   write N deterministic text samples (slices of the corpus
                                     files plus edge cases) as {"text": ...} lines
  compare GENESIS_DIR SAMPLES_JSONL RUST_IDS_JSONL
                                     1. load GENESIS_DIR/tokenizer.json with `tokenizers`,
                                        encode every sample, compare with the ids our Rust
                                        wrapper wrote; decode them back to the sample text;
                                     2. read every validation shard our builder wrote (header
                                        parsed here independently), split it at end-of-text,
                                        decode each document and re-encode it in Python: the
                                        ids must equal the stored ones.
Exit status 0 only if everything matches.
"""

import json
import os
import random
import struct
import sys

from tokenizers import Tokenizer


def write_samples(corpus, out, n):
    files = sorted(
        os.path.join(dp, f)
        for dp, _, fs in os.walk(corpus)
        for f in fs
        if f.endswith(".txt")
    )
    if not files:
        sys.exit(f"no .txt files under {corpus}")
    rng = random.Random(0)
    samples = [
        "",
        " ",
        "a <|endoftext|> b",  # special-token text must stay plain text
        "Café — ünïcode ☃ 🎭 日本語",
        "\t\r\n  trailing   spaces   ",
    ]
    while len(samples) < n:
        text = open(rng.choice(files), encoding="utf-8").read()
        start = rng.randrange(0, max(1, len(text) - 1))
        samples.append(text[start : start + rng.randrange(1, 3000)])
    with open(out, "w", encoding="utf-8") as f:
        for s in samples:
            f.write(json.dumps({"text": s}) + "\n")
    print(f"wrote {len(samples)} samples from {len(files)} files")


def load(genesis):
    tok = Tokenizer.from_file(os.path.join(genesis, "tokenizer.json"))
    # Same setting as our Rust wrapper: special-token strings in text are ordinary text.
    tok.encode_special_tokens = True
    return tok


def read_shard(path):
    data = open(path, "rb").read()
    magic, version, width, count, reserved = struct.unpack_from("<8sIIQQ", data, 0)
    assert magic == b"NSGSHARD", f"{path}: bad magic {magic!r}"
    assert version == 1 and reserved == 0, f"{path}: version {version}"
    fmt = {2: "H", 4: "I"}[width]
    assert len(data) == 32 + count * width, f"{path}: length"
    return list(struct.unpack_from(f"<{count}{fmt}", data, 32))


def compare(genesis, samples_path, rust_ids_path):
    tok = load(genesis)
    samples = [json.loads(l)["text"] for l in open(samples_path, encoding="utf-8")]
    rust = [json.loads(l)["ids"] for l in open(rust_ids_path, encoding="utf-8")]
    assert len(samples) == len(rust), "sample count differs"
    mismatches = 0
    tokens = 0
    for i, (text, ids) in enumerate(zip(samples, rust)):
        py = tok.encode(text, add_special_tokens=False).ids
        tokens += len(py)
        if py != ids:
            mismatches += 1
            if mismatches <= 3:
                print(f"sample {i}: python {py[:20]}... rust {ids[:20]}...")
        if tok.decode(ids, skip_special_tokens=False) != text:
            mismatches += 1
            print(f"sample {i}: python decode of rust ids differs from the text")
    print(
        f"samples: {len(samples)} texts, {tokens} tokens, {mismatches} mismatches "
        f"(tokenizers {__import__('tokenizers').__version__}, vocab {tok.get_vocab_size()})"
    )

    manifest = json.load(open(os.path.join(genesis, "manifest.json")))["manifest"]
    eos = manifest["tokenizer"]["eos_id"]
    shard_docs = shard_tokens = shard_bad = 0
    for s in manifest["shards"]:
        if s["split"] != "val":
            continue
        stream = read_shard(os.path.join(genesis, s["file"]))
        # Validation shards are checked document by document; a document may continue in
        # the next shard, so only complete documents (followed by EOS) are compared.
        docs, cur = [], []
        for t in stream:
            if t == eos:
                docs.append(cur)
                cur = []
            else:
                cur.append(t)
        for d in docs:
            text = tok.decode(d, skip_special_tokens=False)
            if tok.encode(text, add_special_tokens=False).ids != d:
                shard_bad += 1
            shard_docs += 1
            shard_tokens += len(d)
    print(
        f"val shards: {shard_docs} documents, {shard_tokens} tokens re-encoded, "
        f"{shard_bad} mismatches"
    )
    ok = mismatches == 0 and shard_bad == 0 and shard_docs > 0
    print("RESULT:", "MATCH" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "samples" and len(sys.argv) in (4, 5):
        write_samples(sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) == 5 else 500)
    elif mode == "compare" and len(sys.argv) == 5:
        sys.exit(compare(sys.argv[2], sys.argv[3], sys.argv[4]))
    else:
        sys.exit(__doc__)
