#!/usr/bin/env python3
"""The manual builds: `mkdocs build --strict` (a broken link, a nav entry without its page
or a bad setting fails), every page under docs/ is in the nav (mkdocs 1.4 only says so at
INFO level), and the README's links into the tree resolve.

    site.py MKDOCS SOURCE_DIR SITE_DIR
"""
import subprocess
import sys

mkdocs, src, site = sys.argv[1:4]
r = subprocess.run([mkdocs, "build", "--strict", "--clean", "--config-file", f"{src}/mkdocs.yml",
                    "--site-dir", site], capture_output=True, text=True)
log = r.stdout + r.stderr
print(log, end="")
if r.returncode != 0:
    sys.exit(f"docs.site: mkdocs build --strict exited {r.returncode}")
if "not included in the \"nav\"" in log:
    sys.exit("docs.site: pages exist that the nav in mkdocs.yml does not list (above)")
# The README lives outside docs/, so mkdocs does not see its links: every relative link of
# README.md must name a file of the tree (anchors aside).
import os
import re
readme = open(f"{src}/README.md").read()
broken = [t for t in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
          if not re.match(r"[a-z]+:", t) and not os.path.exists(os.path.join(src, t))]
if broken:
    sys.exit("docs.site: README.md links to files that do not exist: " + ", ".join(broken))
print(f"docs.site: built {site}; README.md's links resolve")
