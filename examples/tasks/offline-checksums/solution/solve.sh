#!/bin/bash
set -euo pipefail
cd /app
# LC_ALL=C: byte order, so "Zeta.md" sorts before "a.txt".
find data -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum > SHA256SUMS
sha256sum -c SHA256SUMS
