#!/usr/bin/env bash
# Print the path of a Python 3.13 interpreter for the 3.13 test lane (`make test-py313`).
#
# The first of:
#   1. $ANARCHON_PYTHON313, if set (it must be a working Python 3.13);
#   2. a python3.13 on PATH, or the newest 3.13 of pyenv (PYENV_ROOT, else ~/.pyenv);
#   3. the one this script built before, under $ANARCHON_CACHE (/var/cache/anarchon);
#   4. else it builds one there, once: the upstream source of Debian 13's python3.13
#      package (apt-get source from trixie, with apt's lists kept in the cache: the
#      machine's own apt sources are left alone) and the build dependencies from
#      apt-get install. That needs root and apt-get; it takes a few minutes on 2 cores.
# A working interpreter imports ssl, sqlite3, ctypes and venv and has ensurepip.
# Progress goes to stderr; stdout is the path alone.
set -euo pipefail

CACHE=${ANARCHON_CACHE:-/var/cache/anarchon}
PREFIX=$CACHE/python3.13

works() {
    [ -x "$1" ] && "$1" -c 'import sys, ssl, sqlite3, ctypes, venv, ensurepip
sys.exit(sys.version_info[:2] != (3, 13))' 2>/dev/null
}

found() { echo "python3.13: $1 ($("$1" -VV | head -n1))" >&2; echo "$1"; exit 0; }

if [ -n "${ANARCHON_PYTHON313:-}" ]; then
    works "$ANARCHON_PYTHON313" && found "$ANARCHON_PYTHON313"
    echo "python3.13: ANARCHON_PYTHON313=$ANARCHON_PYTHON313 is not a working Python 3.13" >&2
    exit 1
fi

candidates=()
if on_path=$(command -v python3.13); then
    candidates+=("$on_path")
fi
pyenv_root=${PYENV_ROOT:-${HOME:-/root}/.pyenv}
while IFS= read -r version; do
    candidates+=("$version/bin/python3.13")
done < <(ls -d "$pyenv_root"/versions/3.13.* 2>/dev/null | sort -rV)
candidates+=("$PREFIX/bin/python3.13")
for candidate in "${candidates[@]}"; do
    works "$candidate" && found "$candidate"
done

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "python3.13: no Python 3.13 found, and building one needs root and apt-get." >&2
    echo "  Install one (pyenv install 3.13, your distribution's python3.13) and put it" >&2
    echo "  on PATH, or set ANARCHON_PYTHON313=/path/to/python3.13." >&2
    exit 1
fi

echo "python3.13: none found; building Debian 13's python3.13 into $PREFIX (once)" >&2
export DEBIAN_FRONTEND=noninteractive
deps=(build-essential xz-utils pkg-config libssl-dev libffi-dev libsqlite3-dev zlib1g-dev
    libbz2-dev liblzma-dev libreadline-dev libncurses-dev libgdbm-dev uuid-dev libexpat1-dev)
apt-get install -y -qq --no-install-recommends "${deps[@]}" >&2 ||
    { apt-get update -qq >&2 && apt-get install -y -qq --no-install-recommends "${deps[@]}" >&2; }

src=$CACHE/src
rm -rf "$src"
mkdir -p "$src/lists/partial" "$src/archives/partial"
echo "deb-src http://deb.debian.org/debian trixie main" >"$src/sources.list"
apt_own=(-o "Dir::Etc::SourceList=$src/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
    -o "Dir::State::Lists=$src/lists" -o "Dir::Cache::Archives=$src/archives"
    -o "APT::Sandbox::User=root")
apt-get "${apt_own[@]}" update -qq >&2
(cd "$src" && apt-get "${apt_own[@]}" source --download-only -qq python3.13 >&2)
orig=$(ls "$src"/python3.13_*.orig.tar.* | head -n1)
mkdir "$src/build"
tar -xf "$orig" -C "$src/build" --strip-components=1
log=$CACHE/python3.13-build.log
echo "python3.13: building $(basename "$orig") (the log: $log)" >&2
if ! (
    cd "$src/build"
    ./configure --prefix="$PREFIX" --disable-test-modules --with-ensurepip=install
    make -j"$(nproc)"
    rm -rf "$PREFIX"
    make install
) >"$log" 2>&1; then
    tail -n 30 "$log" >&2
    echo "python3.13: the build failed; the whole log is $log" >&2
    exit 1
fi
rm -rf "$src"
works "$PREFIX/bin/python3.13" && found "$PREFIX/bin/python3.13"
echo "python3.13: the build in $PREFIX does not work" >&2
exit 1
