#!/bin/sh
# torchbay container entrypoint (TorchServe's dockerd-entrypoint.sh conventions, KServe's layout).
#
#   serve [extra torchbay serve flags]   the default command: exec torchbay serve ...
#   anything else                        exec'd as given (e.g. `sh`, `torchbay archive ...`)
#
# Where things come from (environment wins, then the layout found on disk, then the default):
#   TORCHBAY_KSERVE_ROOT  /mnt/models           KServe storage-initializer folder
#   TORCHBAY_HOME         /home/model-server    TorchServe image home
#   TORCHBAY_CONFIG       $TORCHBAY_KSERVE_ROOT/config/config.properties if it exists,
#                         else $TORCHBAY_HOME/config.properties if it exists, else none
#   TORCHBAY_MODEL_STORE  $TORCHBAY_KSERVE_ROOT/model-store if it exists,
#                         else $TORCHBAY_HOME/model-store
#   TORCHBAY_HOST         0.0.0.0 (inside a container; the tests run it with 127.0.0.1)
#   TORCHBAY_INFERENCE_PORT / TORCHBAY_MANAGEMENT_PORT / TORCHBAY_METRICS_PORT  8080/8081/8082
#   TORCHBAY_READY_FILE   write the bound ports as JSON there once the models loaded
# A listener's address: TORCHBAY_HOST or its port variable set -> that; else the config file's
# <name>_address if it has one (KServe's config puts inference and management on one port);
# else $TORCHBAY_HOST:<default port>. TORCHBAY_HOST (an IPv6 address with or without brackets)
# binds the gRPC listeners too unless TORCHBAY_GRPC_{INFERENCE,MANAGEMENT}_ADDRESS name their
# own. Any other setting: TORCHBAY_<KEY> (e.g.
# TORCHBAY_DISABLE_TOKEN_AUTHORIZATION=true, TORCHBAY_LOAD_MODELS=all), read by torchbay itself.
# TORCHBAY_BIN (default torchbay) is the command run.
set -eu

if [ "${1:-serve}" != "serve" ]; then
  exec "$@"
fi
[ "$#" -gt 0 ] && shift

kserve_root=${TORCHBAY_KSERVE_ROOT:-/mnt/models}
home=${TORCHBAY_HOME:-/home/model-server}

config=${TORCHBAY_CONFIG:-}
if [ -z "$config" ]; then
  if [ -f "$kserve_root/config/config.properties" ]; then
    config=$kserve_root/config/config.properties
  elif [ -f "$home/config.properties" ]; then
    config=$home/config.properties
  fi
fi

store=${TORCHBAY_MODEL_STORE:-}
if [ -z "$store" ]; then
  if [ -d "$kserve_root/model-store" ]; then
    store=$kserve_root/model-store
  else
    store=$home/model-store
  fi
fi

# config_has KEY: the config file sets KEY (a java-properties line "KEY=..." or "KEY: ...").
config_has() {
  [ -n "$config" ] && grep -Eq "^[[:space:]]*$1[[:space:]]*[=:]" "$config"
}

# The host in a URL: an IPv6 address goes in brackets (http://[::]:8080).
url_host=${TORCHBAY_HOST:-0.0.0.0}
case $url_host in
  \[*) ;;
  *:*) url_host="[$url_host]" ;;
esac

# address NAME PORT_VALUE DEFAULT_PORT: print the --NAME-address flag's value, or nothing.
address() {
  if [ -n "${TORCHBAY_HOST:-}" ] || [ -n "$2" ] || ! config_has "$1_address"; then
    echo "http://$url_host:${2:-$3}"
  fi
}

# The host chosen for the HTTP listeners binds gRPC too (the config's gRPC addresses would
# otherwise stay, e.g. the image's 0.0.0.0 under TORCHBAY_HOST=127.0.0.1).
if [ -n "${TORCHBAY_HOST:-}" ]; then
  export TORCHBAY_GRPC_INFERENCE_ADDRESS="${TORCHBAY_GRPC_INFERENCE_ADDRESS:-$TORCHBAY_HOST}"
  export TORCHBAY_GRPC_MANAGEMENT_ADDRESS="${TORCHBAY_GRPC_MANAGEMENT_ADDRESS:-$TORCHBAY_HOST}"
fi

set -- --model-store "$store" "$@"
[ -n "$config" ] && set -- --ts-config "$config" "$@"
[ -n "${TORCHBAY_READY_FILE:-}" ] && set -- --ready-file "$TORCHBAY_READY_FILE" "$@"
# port VALUE: VALUE, unless it is a Kubernetes service link: a Service named torchbay-inference
# in the pod's namespace makes TORCHBAY_INFERENCE_PORT=tcp://10.0.0.1:8080, which is no port.
port() {
  case $1 in
    *://*) ;;
    *) echo "$1" ;;
  esac
}

value=$(address inference "$(port "${TORCHBAY_INFERENCE_PORT:-}")" 8080)
[ -n "$value" ] && set -- --inference-address "$value" "$@"
value=$(address management "$(port "${TORCHBAY_MANAGEMENT_PORT:-}")" 8081)
[ -n "$value" ] && set -- --management-address "$value" "$@"
value=$(address metrics "$(port "${TORCHBAY_METRICS_PORT:-}")" 8082)
[ -n "$value" ] && set -- --metrics-address "$value" "$@"

# The variables above are this script's, not torchbay settings: torchbay would log each one
# as an "ignored unknown environment variable" although it took effect.
bin=${TORCHBAY_BIN:-torchbay}
unset TORCHBAY_KSERVE_ROOT TORCHBAY_HOME TORCHBAY_CONFIG TORCHBAY_HOST TORCHBAY_READY_FILE \
  TORCHBAY_INFERENCE_PORT TORCHBAY_MANAGEMENT_PORT TORCHBAY_METRICS_PORT TORCHBAY_BIN
exec "$bin" serve "$@"
