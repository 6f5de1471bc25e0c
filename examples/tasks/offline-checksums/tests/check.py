"""Reward 1 when /app/SHA256SUMS matches the data files exactly (content, order, format)."""
import hashlib
import sys
from pathlib import Path

app = Path("/app")
data = app / "data"
expected_files = {
    "data/Zeta.md": "Zeta comes last in ASCII order? No: upper case sorts first.\n",
    "data/a.txt": "alpha\n",
    "data/fox.txt": "The quick brown fox jumps over the lazy dog",
    "data/nested/empty.dat": "",
    "data/nested/values.csv": "id,value\n1,10\n2,20\n3,30\n",
}
# The data must be untouched: hash the files as shipped, not as found.
for rel, content in expected_files.items():
    if (app / rel).read_bytes() != content.encode():
        sys.exit(f"{rel} was modified")
found = sorted(p.relative_to(app).as_posix() for p in data.rglob("*") if p.is_file())
if found != sorted(expected_files):
    sys.exit(f"unexpected files in data/: {found}")
lines = [
    f"{hashlib.sha256(expected_files[rel].encode()).hexdigest()}  {rel}"
    for rel in sorted(expected_files, key=lambda r: r.encode())
]
want = "\n".join(lines) + "\n"
manifest = app / "SHA256SUMS"
if not manifest.is_file():
    sys.exit("SHA256SUMS is missing")
got = manifest.read_text()
if got != want:
    sys.exit(f"SHA256SUMS differs\n--- got\n{got}--- want\n{want}")
print("SHA256SUMS ok")
