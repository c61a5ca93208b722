#!/bin/sh
# Check the unit files with systemd's own parser. Needs systemd-analyze (package `systemd`);
# works in a container without systemd running as PID 1.
# Usage: deploy/verify.sh [path/to/weft]   (default: target/debug/weft, else /usr/local/bin/weft)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
if ! command -v systemd-analyze >/dev/null 2>&1; then
    echo "systemd-analyze not found: install the 'systemd' package, or verify on the target host with" >&2
    echo "  systemd-analyze verify /etc/systemd/system/clawft.service" >&2
    exit 2
fi
weft=${1:-}
if [ -z "$weft" ]; then
    for c in "${CARGO_TARGET_DIR:-$here/../target}/debug/weft" /usr/local/bin/weft; do
        if [ -x "$c" ]; then weft=$c; break; fi
    done
fi
[ -n "$weft" ] || { echo "no weft binary found: pass its path" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# verify checks that ExecStart= exists: point both units at the binary under test, and the
# credentials at files that exist.
for unit in clawft.service clawft-user.service clawft-node.service; do
    sed -e "s|^ExecStart=[^ ]*|ExecStart=$weft|" \
        -e "s|^LoadCredential=\([^:]*\):.*|LoadCredential=\1:/dev/null|" \
        "$here/systemd/$unit" >"$tmp/$unit"
done
out=$(systemd-analyze verify --man=no "$tmp/clawft.service" 2>&1) || { echo "$out" >&2; exit 1; }
# A user unit is verified in the user manager's scope (no manager needed with --user on 25x
# when run as root; fall back to the system scope, which parses the same directives).
out_user=$(systemd-analyze verify --man=no --user "$tmp/clawft-user.service" 2>&1) ||
    out_user=$(systemd-analyze verify --man=no "$tmp/clawft-user.service" 2>&1) ||
    { echo "$out_user" >&2; exit 1; }
# The NATS server's unit: its binary is not ours; any executable stands in.
sed -e "s|^ExecStart=[^ ]*|ExecStart=$weft|" "$here/systemd/clawft-nats.service" >"$tmp/clawft-nats.service"
out_nats=$(systemd-analyze verify --man=no "$tmp/clawft-nats.service" 2>&1) || { echo "$out_nats" >&2; exit 1; }
out_node=$(systemd-analyze verify --man=no --user "$tmp/clawft-node.service" 2>&1) ||
    out_node=$(systemd-analyze verify --man=no "$tmp/clawft-node.service" 2>&1) ||
    { echo "$out_node" >&2; exit 1; }
# verify exits 0 on unknown directives; treat any warning about our units as a failure.
if printf '%s\n%s\n%s\n%s\n' "$out" "$out_user" "$out_node" "$out_nats" | grep -E "clawft(-user|-node|-nats)?\.service:" >&2; then
    exit 1
fi
echo "ok: clawft.service, clawft-user.service, clawft-node.service and clawft-nats.service verify"
