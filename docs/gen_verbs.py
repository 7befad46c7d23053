#!/usr/bin/env python3
"""Writes the manual's command pages from the program's own help.

    docs/gen_verbs.py ULPGATE [--check]

For every verb that `ULPGATE --help` lists under "Subcommands:" it writes docs/verbs/VERB.md
from `ULPGATE VERB --help` (and, for a verb with verbs of its own such as `baseline`, from
`ULPGATE VERB SUB --help` for each), docs/verbs/index.md with the list, and the block between
"# verbs:begin" and "# verbs:end" in mkdocs.yml. A page may keep hand-written notes below the
line "<!-- notes -->": they are carried over.

With --check nothing is written: the exit code is 1, with the differences on stderr, when a
committed page, the index or the nav differs from what the binary says, when a page exists
for a verb the binary no longer has, or when the README's command table does not link a
verb's page. ctest docs.verbs runs that check.

It needs only `ULPGATE --help` and `ULPGATE VERB --help` with CLI11's "Subcommands:" section
(one verb per line, two spaces in, its summary after), so it keeps working whatever file the
verbs live in.
"""
import difflib
import pathlib
import re
import subprocess
import sys

DOCS = pathlib.Path(__file__).resolve().parent
MKDOCS = DOCS.parent / "mkdocs.yml"
NOTES = "<!-- notes -->"
BEGIN, END = "# verbs:begin", "# verbs:end"


def help_text(ulpgate, *verb):
    r = subprocess.run([ulpgate, *verb, "--help"], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"gen_verbs: '{' '.join([ulpgate, *verb, '--help'])}' exited {r.returncode}: {r.stderr.strip()}")
    return r.stdout.rstrip() + "\n"


def subcommands(text):
    """(name, summary) of each line of the "Subcommands:" section."""
    out, inside = [], False
    for line in text.splitlines():
        if line.strip() == "Subcommands:":
            inside = True
            continue
        if inside:
            m = re.match(r"^  (\S+)\s*(.*)$", line)
            if m:
                out.append((m.group(1), m.group(2).strip()))
            elif line and not line.startswith(" "):
                inside = False
    return out


def page(ulpgate, verb, summary, notes):
    text = help_text(ulpgate, verb)
    parts = [f"# ulpgate {verb}\n", f"{summary}\n",
             "<!-- Written by docs/gen_verbs.py from `ulpgate " + verb + " --help`; edit the help text, "
             "not this page (notes go below the notes marker). -->\n",
             "```text\n" + text + "```\n"]
    for sub, sub_summary in subcommands(text):
        parts.append(f"## ulpgate {verb} {sub}\n\n{sub_summary}\n")
        parts.append("```text\n" + help_text(ulpgate, verb, sub) + "```\n")
    parts.append(NOTES + "\n" + (notes if notes else ""))
    return "\n".join(parts)


def main():
    args = [a for a in sys.argv[1:] if a != "--check"]
    check = "--check" in sys.argv[1:]
    if len(args) != 1:
        sys.exit(__doc__)
    ulpgate = args[0]
    top = help_text(ulpgate)
    verbs = subcommands(top)
    if not verbs:
        sys.exit("gen_verbs: no verbs under 'Subcommands:' in 'ulpgate --help'")
    verb_dir = DOCS / "verbs"
    want = {}
    for verb, summary in verbs:
        path = verb_dir / f"{verb}.md"
        old = path.read_text() if path.exists() else ""
        notes = old.split(NOTES + "\n", 1)[1] if NOTES + "\n" in old else ""
        want[path] = page(ulpgate, verb, summary, notes)
    rows = "\n".join(f"| [`{v}`]({v}.md) | {s.replace('|', '&#124;')} |" for v, s in verbs)
    want[verb_dir / "index.md"] = (
        "# Commands\n\n"
        "Every verb of `ulpgate`, with its help as the program prints it (`ulpgate VERB --help`).\n"
        "These pages are written by `docs/gen_verbs.py` from the binary; ctest `docs.verbs` fails\n"
        "when they differ from it.\n\n"
        "```text\n" + top + "```\n\n"
        "| verb | what it does |\n|---|---|\n" + rows + "\n")
    nav = "".join(f"      - {v}: verbs/{v}.md\n" for v, _ in verbs)
    yml = MKDOCS.read_text()
    m = re.search(r"(?m)^( *)" + re.escape(BEGIN) + r"[^\n]*\n(.*?)^ *" + re.escape(END), yml, re.S)
    if not m:
        sys.exit(f"gen_verbs: no '{BEGIN}' ... '{END}' block in {MKDOCS}")
    new_yml = yml[:m.start(2)] + nav + yml[m.end(2):]

    stale = sorted(p for p in verb_dir.glob("*.md") if p not in want)
    if check:
        bad = False
        for path, text in list(want.items()) + [(MKDOCS, new_yml)]:
            old = path.read_text() if path.exists() else ""
            if old != text:
                bad = True
                rel = path.relative_to(DOCS.parent)
                what = "missing" if not old else "differs from the binary's help"
                sys.stderr.write(f"{rel}: {what}\n")
                sys.stderr.writelines(difflib.unified_diff(old.splitlines(True), text.splitlines(True),
                                                           f"committed {rel}", "from the binary", n=1))
        for path in stale:
            bad = True
            sys.stderr.write(f"{path.relative_to(DOCS.parent)}: a page for a verb 'ulpgate --help' does not list\n")
        readme = (DOCS.parent / "README.md").read_text()
        for verb, _ in verbs:
            if f"(docs/verbs/{verb}.md)" not in readme:
                bad = True
                sys.stderr.write(f"README.md: the command table has no row linking docs/verbs/{verb}.md\n")
        if bad:
            sys.stderr.write(f"gen_verbs: run 'docs/gen_verbs.py {ulpgate}' and commit the pages\n")
            return 1
        print(f"gen_verbs: {len(verbs)} verb pages match the binary's help")
        return 0
    verb_dir.mkdir(exist_ok=True)
    for path, text in want.items():
        path.write_text(text)
    MKDOCS.write_text(new_yml)
    for path in stale:
        path.unlink()
        print(f"removed {path.relative_to(DOCS.parent)}")
    print(f"gen_verbs: wrote {len(verbs)} verb pages, docs/verbs/index.md and the nav")
    return 0


if __name__ == "__main__":
    sys.exit(main())
