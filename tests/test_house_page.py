"""docs/house.md and the README's reading list say what the package is now: every module named on the house page,
and the line counts they print within 10% of `wc -l` (so they are refreshed when a room grows or shrinks)."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tinygrad_ckpt"
HOUSE = (ROOT / "docs" / "house.md").read_text()


def lines(path: pathlib.Path) -> int:
    files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return sum(len(f.read_text().splitlines()) for f in files)


def table_rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in row.strip().strip("|").split("|")] for row in text.splitlines()
            if row.startswith("|") and not row.startswith("|---")]


def test_every_module_is_named_on_the_house_page():
    missing = [str(p.relative_to(PACKAGE)) for p in sorted(PACKAGE.rglob("*.py"))
               if p.name != "__init__.py" and f"`{p.name}`" not in HOUSE]
    assert missing == [], f"docs/house.md names no {missing}: say which floor each is on and what it is"


def test_the_house_pages_line_counts_are_current():
    checked = 0
    for row in table_rows(HOUSE):
        if len(row) < 3 or not row[0].isdigit():
            continue
        rooms = [PACKAGE / name for name in re.findall(r"`([\w/.]+)`", row[1])
                 if (name.endswith("/") and (PACKAGE / name).is_dir()) or (PACKAGE / name).is_file()]
        counts = [int(n.replace(",", "")) for n in re.findall(r"\d[\d,]*", row[2])]
        assert len(rooms) == len(counts), f"floor {row[0]}: {len(rooms)} rooms but {len(counts)} counts"
        for room, count in zip(rooms, counts):
            assert abs(count - lines(room)) <= 0.1 * lines(room), f"{room.name}: page {count}, wc -l {lines(room)}"
            checked += 1
    assert checked >= 12


def test_the_readmes_reading_list_is_current():
    rows = [r for r in table_rows((ROOT / "README.md").read_text()) if r[0].startswith("`tinygrad_ckpt/")]
    assert len(rows) >= 6
    for path, count, minutes, *_ in rows:
        n = lines(ROOT / path.strip("`"))
        assert abs(int(count) - n) <= 0.1 * n, f"{path}: README {count}, wc -l {n}"
        assert abs(int(minutes.split()[0]) - n / 25) <= 2, f"{path}: {minutes} at 25 lines a minute"
