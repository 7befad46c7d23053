#!/usr/bin/env python3
"""The manual builds: `mkdocs build --strict` (a broken link, a nav entry without its page
or a bad setting fails), and every page under docs/ is in the nav (mkdocs 1.4 only says so at
INFO level).

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
print(f"docs.site: built {site}")
