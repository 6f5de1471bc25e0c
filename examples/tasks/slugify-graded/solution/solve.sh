#!/bin/bash
set -euo pipefail
cat > /app/slug.py <<'PY'
"""URL slugs from arbitrary text."""
import re
import unicodedata

MAX_LENGTH = 50


def slugify(text: str) -> str:
    """Lower-case ASCII words of `text` joined by '-', at most 50 characters, whole words."""
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    slug = re.sub(r"[^a-z0-9]+", "-", ascii_text.lower()).strip("-")
    if len(slug) <= MAX_LENGTH:
        return slug
    cut = slug[: MAX_LENGTH + 1]
    if "-" in cut:
        return cut[: cut.rindex("-")].rstrip("-")
    return slug[:MAX_LENGTH]
PY
