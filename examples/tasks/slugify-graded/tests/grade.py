"""Writes /logs/verifier/reward.json: {"reward": fraction of cases passed, "style": 0 or 1}.

Style only counts for a working module (reward > 0), so an untouched stub scores 0 on both.
"""
import ast
import json
import sys
from pathlib import Path

CASES = [
    ("Hello, World!", "hello-world"),
    ("  --Already-a-slug--  ", "already-a-slug"),
    ("¿Qué tal?", "que-tal"),
    ("Crème Brûlée", "creme-brulee"),
    ("!!!", ""),
    ("", ""),
    ("a__b  c", "a-b-c"),
    ("Version 2.0 released", "version-2-0-released"),
    ("naïve café", "naive-cafe"),
    ("日本語 text", "text"),
    ("word " * 20, "word-word-word-word-word-word-word-word-word-word"),
    ("x" * 60, "x" * 50),
    ("aaaa bbbb cccc dddd eeee ffff gggg hhhh iiii jjjj kkkk", "aaaa-bbbb-cccc-dddd-eeee-ffff-gggg-hhhh-iiii-jjjj"),
]

out = Path("/logs/verifier/reward.json")
source_path = Path("/app/slug.py")
passed = 0
try:
    sys.path.insert(0, "/app")
    from slug import slugify

    for text, expected in CASES:
        try:
            got = slugify(text)
        except Exception as exc:  # a crash on one case costs that case only
            got = f"<{type(exc).__name__}>"
        ok = got == expected
        passed += ok
        print(f"{'ok  ' if ok else 'FAIL'} {text!r} -> {got!r} (expected {expected!r})")
except Exception as exc:
    print(f"cannot import /app/slug.py: {exc!r}")

reward = round(passed / len(CASES), 4)
style = 0
if reward > 0 and source_path.exists():
    source = source_path.read_text()
    tree = ast.parse(source)
    func = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "slugify"), None)
    checks = {
        "module docstring": ast.get_docstring(tree) is not None,
        "function docstring": func is not None and ast.get_docstring(func) is not None,
        "lines <= 100": all(len(line) <= 100 for line in source.splitlines()),
        "no tabs": "\t" not in source,
    }
    print("style:", checks)
    style = int(all(checks.values()))
out.write_text(json.dumps({"reward": reward, "style": style}))
print(out.read_text())
