"""``python -m anarchon_core``: the ``anarchon`` command without the console script.

The demo starts its instances this way, so it works from a source checkout too.
"""

from __future__ import annotations

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
