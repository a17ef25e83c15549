#!/usr/bin/env bash
# The chaos suite (tests/chaos/README.md): a cluster across network
# namespaces under a seeded fault schedule while it serves; the last line is a
# JSON report, the exit status non-zero on any violation.
#   tests/chaos/run.sh [--seed S] [--minutes M] [--help for the rest]
set -euo pipefail
exec /usr/bin/python3 "$(dirname "$0")/chaos.py" "$@"
