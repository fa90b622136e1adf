# Sourced by the tools/ scripts: start_server PYTHON REPO starts `python -m server --port 0` from
# REPO in the background, waits for its one "listening on" line, exports TENSORWIRE_URL, and
# stops the server when the calling script exits.
start_server() {
  local log
  log=$(mktemp)
  (cd "$2" && exec "$1" -m server --port 0 >"$log" 2>&1) &
  server_pid=$!
  trap 'kill $server_pid 2>/dev/null; rm -f "'"$log"'"' EXIT
  until grep -q "listening on" "$log"; do
    kill -0 "$server_pid" 2>/dev/null || { echo "the server did not start:"; cat "$log"; exit 1; }
    sleep 0.2
  done
  TENSORWIRE_URL=$(grep -o "ws://[0-9.:]*" "$log" | head -1)
  export TENSORWIRE_URL
}
