#!/usr/bin/env python3
"""Runs every shell block of the README and the tutorial, as written.

    walkthrough.py SOURCE_DIR BUILD_DIR WORK_DIR [PYTHON]

Each fenced block marked ```sh (or bash, shell) of README.md and docs/tutorial.md is cut into
commands (a heredoc or a line continued with a backslash is one command) and run, block after
block, in one bash process per file, in WORK_DIR/<file>: a folder holding links to the tree's
top-level entries, with `build` pointing at BUILD_DIR, so that `build/ulpgate`, `examples/...`
and `include` resolve as they do at the repository root. A command must exit 0, or the code
its trailing comment names (`# exit 1`). PYTHON (one that imports NumPy) is put first on the
PATH as `python3`.

A command that cannot run here is listed in SKIP with the reason; the test fails if a listed
command no longer appears in either file (the list must not outlive the text). Fenced blocks
without a language fail too: each block says whether it is a command (sh) or output (text).
"""
import os
import pathlib
import re
import shlex
import subprocess
import sys

FILES = ["README.md", "docs/tutorial.md"]
SHELL = {"sh", "bash", "shell"}

SET_UP = (".ci/install-deps && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release && "
          "cmake --build build --target ulpgate && build/ulpgate fuzz")
TEST = ("cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release && cmake --build build && "
        "ctest --test-dir build --output-on-failure -j2")
SKIP = {
    SET_UP: "installs Debian packages (root, network) and builds the tree this test runs from; "
            ".ci/run runs .ci/install-deps and the same build (checked below), and the default "
            "campaign's CPU models are gated by self_gate.cpu_models",
    TEST: "is the test command: .ci/run runs it verbatim (checked below); running it here would "
          "run this test inside itself",
}


def blocks(text):
    """(language, first line number, body) of each fenced block."""
    out, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = re.match(r"^```(\S*)\s*$", lines[i])
        if m:
            start, body = i + 1, []
            i += 1
            while i < len(lines) and lines[i].rstrip() != "```":
                body.append(lines[i])
                i += 1
            out.append((m.group(1), start + 1, body))
        i += 1
    return out


def commands(body):
    """The block's commands: heredocs and continued lines kept whole."""
    out, i = [], 0
    while i < len(body):
        line = body[i]
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        cmd = [line]
        while cmd[-1].endswith("\\") and i < len(body):
            cmd.append(body[i])
            i += 1
        heredoc = re.search(r"<<-?\s*'?(\w+)'?", cmd[-1])
        if heredoc:
            while i < len(body):
                cmd.append(body[i])
                i += 1
                if cmd[-1].strip() == heredoc.group(1):
                    break
        out.append("\n".join(cmd))
    return out


def expected_exit(cmd):
    m = re.search(r"#\s*exit\s+(\d+)\s*$", cmd.splitlines()[0])
    return int(m.group(1)) if m else 0


def main():
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__)
    src, build, work = (pathlib.Path(a).resolve() for a in sys.argv[1:4])
    python = sys.argv[4] if len(sys.argv) == 5 else None
    failures, ran, skipped, seen = [], 0, 0, set()

    ci_run = (src / ".ci" / "run").read_text()
    if TEST not in ci_run.splitlines():
        failures.append(f".ci/run does not run the README's test command verbatim: {TEST}")
    # The set-up command builds the program alone (the main job needs nothing else); the test
    # command configures the same way and builds everything.
    if ".ci/install-deps" not in ci_run or SET_UP.split(" && ")[1] + " && cmake --build build" not in TEST:
        failures.append(".ci/run no longer installs and configures as the README's set-up command does")

    for name in FILES:
        text = (src / name).read_text()
        where = work / name.replace("/", "_")
        subprocess.run(["rm", "-rf", str(where)], check=True)
        where.mkdir(parents=True)
        for entry in src.iterdir():
            if entry.name not in (".git",) and not entry.name.startswith("build"):
                (where / entry.name).symlink_to(entry)
        (where / "build").symlink_to(build)
        env = dict(os.environ)
        if python:
            bindir = work / ".bin"
            bindir.mkdir(exist_ok=True)
            link = bindir / "python3"
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(python)
            env["PATH"] = f"{bindir}:{env['PATH']}"

        script = ["set -u", "__fail() { echo \"walkthrough: $1\" >&2; exit 1; }"]
        for lang, line, body in blocks(text):
            if not lang:
                failures.append(f"{name}:{line}: a fenced block without a language (sh for commands, text for output)")
                continue
            if lang not in SHELL:
                continue
            for cmd in commands(body):
                first = cmd.splitlines()[0]
                if cmd.strip() in SKIP:
                    seen.add(cmd.strip())
                    skipped += 1
                    print(f"{name}:{line}: skipped: {first}\n    ({SKIP[cmd.strip()]})")
                    continue
                want = expected_exit(cmd)
                ran += 1
                script.append(f"echo {shlex.quote(f'$ {first}')}")
                script.append(cmd)
                script.append(f"__rc=$?; [ $__rc -eq {want} ] || __fail "
                              + shlex.quote(f"{name}:{line}: exit ") + "$__rc" + shlex.quote(f", expected {want}: {first}"))
        (where / "walkthrough.sh").unlink(missing_ok=True)
        r = subprocess.run(["bash", "-c", "\n".join(script) + "\n"], cwd=where, env=env)
        if r.returncode != 0:
            failures.append(f"{name}: a command failed (output above)")

    for cmd in SKIP:
        if cmd not in seen:
            failures.append(f"SKIP lists a command neither file shows any more: {cmd}")
    print(f"walkthrough: {ran} commands run, {skipped} skipped with a reason")
    for f in failures:
        print(f"walkthrough: FAIL {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
