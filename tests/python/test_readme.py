"""The README's options table against the loader it documents: every keyword argument of
feedline.ImageLoader is a row, with its real default, and no row names an argument that does
not exist."""
import ast
import inspect
import pathlib
import re

import feedline

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def _options_table():
    lines = README.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("<!-- options table"))
    rows = {}
    for line in lines[start + 3:]:  # the marker, the header, the rule
        if not line.startswith("|"):
            break
        name, default = [c.strip() for c in line.strip("|").split("|")][:2]
        rows[name.strip("`")] = default.strip("`")
    return rows


def test_every_imageloader_argument_is_in_the_readme_with_its_default():
    rows = _options_table()
    params = {n: p for n, p in inspect.signature(feedline.ImageLoader).parameters.items()
              if n != "source"}
    assert set(rows) == set(params), (
        f"README options table: missing {sorted(set(params) - set(rows))}, "
        f"not arguments {sorted(set(rows) - set(params))}")
    for name, p in params.items():
        shown = rows[name]
        assert ast.literal_eval(shown) == p.default, (
            f"README says {name}={shown}, ImageLoader's default is {p.default!r}")


def test_every_readme_link_to_docs_points_at_a_heading():
    root = README.parent
    text = README.read_text()
    for target, anchor in re.findall(r"\]\((docs/[\w.]+)(?:#([\w-]+))?\)", text):
        doc = root / target
        assert doc.exists(), target
        if anchor:
            slugs = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
                     for h in re.findall(r"^#+ (.*)$", doc.read_text(), re.M)}
            assert anchor in slugs, f"{target}#{anchor}: no such heading"
