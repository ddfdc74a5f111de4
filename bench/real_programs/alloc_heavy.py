# python3 workload: allocation-heavy work of a typical script (dicts of lists, strings, json
# round trips, sorting, sets, short-lived tuples) over SIZE records. It prints digests of what it
# built, so the output depends only on SIZE (the workload runs it with PYTHONHASHSEED=0, since
# set and dict-of-str iteration order would otherwise vary between runs). Exits 1 when a round
# trip does not give back what it started with.
import hashlib
import json
import sys

size = int(sys.argv[1]) if len(sys.argv) > 1 else 10000
digest = hashlib.sha256()


def record(i):
    return {
        "id": i,
        "name": "user-%d" % (i * 7919 % 100003),
        "tags": ["t%d" % (i % k) for k in range(2, 2 + i % 9)],
        "scores": [((i * j) % 101) / 7.0 for j in range(i % 13)],
        "address": {"street": "%d Main St" % (i % 997), "zip": "%05d" % (i * 31 % 99991)},
    }


records = [record(i) for i in range(size)]
by_tag = {}
for r in records:
    for t in r["tags"]:
        by_tag.setdefault(t, []).append(r["id"])
digest.update(repr(sorted((t, len(ids), sum(ids)) for t, ids in by_tag.items())).encode())

# json: dump in chunks, load back, compare
for start in range(0, size, 500):
    chunk = records[start:start + 500]
    text = json.dumps(chunk, sort_keys=True)
    if json.loads(text) != chunk:
        print("json round trip differs at", start)
        sys.exit(1)
    digest.update(hashlib.sha256(text.encode()).digest())

# strings: build, split, join, dedupe
words = [" ".join(r["name"] + t for t in r["tags"]) for r in records]
vocabulary = set()
for w in words:
    vocabulary.update(w.split())
digest.update(str(len(vocabulary)).encode())
digest.update("|".join(sorted(vocabulary)[:1000]).encode())

# many short-lived small objects: tuples, sorting, dict churn
table = {}
for round_ in range(4):
    pairs = sorted(((r["id"] * (round_ + 3)) % 1009, r["name"]) for r in records)
    for key, name in pairs:
        table[(key, round_)] = name[::-1]
    for key in [k for k in table if k[0] % 2 == round_ % 2]:
        del table[key]
digest.update(str(len(table)).encode())
digest.update(repr(sorted(table.items())[:200]).encode())

print("records", len(records), "tags", len(by_tag), "vocabulary", len(vocabulary), "table", len(table))
print("digest", digest.hexdigest())
