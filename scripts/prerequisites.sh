#!/usr/bin/env bash
# The system packages that `make test` needs beside Python, installed when missing.
# Idempotent: `make test` runs it every time (and so `.ci/run`); it does nothing when all
# is there. It installs with apt-get as root; otherwise it names what to install.
#   - libmariadb-dev and pkg-config: mysqlclient, in the dev extra, builds against them,
#     so `pip install` fails without them: missing, this script stops `make test`.
#   - chromium and chromium-driver: the browser tests. Missing, this script warns and the
#     suite skips those tests with the reason (or fails them under
#     ANARCHON_REQUIRE_SERVICES=1, as in CI).
set -euo pipefail

can_install() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; }

apt_install() {  # apt_install PACKAGE...: from the package lists as they are, else updated
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq --no-install-recommends "$@" >/dev/null ||
        { apt-get update -qq && apt-get install -y -qq --no-install-recommends "$@" >/dev/null; }
}

have_client_headers() {
    command -v pkg-config >/dev/null &&
        { pkg-config --exists mariadb || pkg-config --exists mysqlclient; } 2>/dev/null
}

if ! have_client_headers; then
    if can_install; then
        echo "prerequisites: installing libmariadb-dev and pkg-config (mysqlclient builds against them)"
        apt_install libmariadb-dev pkg-config || echo "prerequisites: apt-get failed" >&2
    fi
    if ! have_client_headers; then
        echo "prerequisites: the MariaDB/MySQL client headers are missing, and mysqlclient (in the" >&2
        echo "dev extra) cannot build without them. Install them as root, then run make test again:" >&2
        echo "    apt-get install libmariadb-dev pkg-config   # or default-libmysqlclient-dev" >&2
        exit 1
    fi
fi

if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    if can_install; then
        echo "prerequisites: installing chromium and chromium-driver for the browser tests"
        apt_install chromium chromium-driver || echo "prerequisites: apt-get failed" >&2
    fi
    if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
        echo "prerequisites: chromium or chromedriver is missing: the browser tests will be" >&2
        echo "skipped (failed under ANARCHON_REQUIRE_SERVICES=1). To run them, as root:" >&2
        echo "    apt-get install --no-install-recommends chromium chromium-driver" >&2
    fi
fi
