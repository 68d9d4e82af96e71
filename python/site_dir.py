# site_dir.py PREFIX - prints the folder on this interpreter's sys.path where
# a package installed under PREFIX is imported from (PREFIX/lib.../site- or
# dist-packages), or nothing. python/meson.build installs the package there:
# on Debian, meson's own choice for /usr/local (lib/python3/dist-packages) is
# not on sys.path, /usr/local/lib/python3.X/dist-packages is.
import os
import sys

prefix = os.path.realpath(sys.argv[1])
for entry in sys.path:
    if not entry or os.path.basename(entry) not in ("dist-packages", "site-packages"):
        continue
    rel = os.path.relpath(os.path.realpath(entry), prefix)
    if rel.startswith("lib"):
        print(entry)
        break
