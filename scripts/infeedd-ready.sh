# Sourced by demo.sh and examples/custom_program/train.sh (bash).
#
# infeedd_ready FILE PID: waits until the infeedd of process PID has written its --ready-file
# FILE (once every socket is bound and served), then sets LISTEN, PUBLISH and CONTROL to the
# endpoints it bound ("" for a socket that is off). Start infeedd with the ports '*'
# (--listen 'tcp://127.0.0.1:*' ...) and --ready-file FILE: no port is picked beforehand and
# released before the daemon binds it (another program may take it in between). Returns 1 when
# the daemon exited before it was ready.
infeedd_ready() {
  local file=$1 pid=$2
  while [ ! -e "$file" ]; do
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.05
  done
  local endpoints
  endpoints=$(python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))
print("\x1f".join(r[k] or "" for k in ("listen", "publish", "control")))' "$file") || return 1
  IFS=$'\x1f' read -r LISTEN PUBLISH CONTROL <<<"$endpoints"
}
