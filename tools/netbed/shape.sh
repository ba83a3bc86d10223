# Sourced by the test beds (tools/netbed/netbed, tools/serving/serve-bed): one way to shape a link.
#
# shape NS DEV RATE_MBIT: the device's egress in namespace NS limited to RATE_MBIT with tc tbf.
# burst: at least one 64 KiB GSO segment plus 2 ms at the rate, so tbf never drops a packet for
# being larger than its bucket.
shape() {
  local ns="$1" dev="$2" rate="$3"
  local burst=$(( rate * 1000000 / 8 / 500 ))
  (( burst < 131072 )) && burst=131072
  ip netns exec "$ns" tc qdisc replace dev "$dev" root tbf rate "${rate}mbit" burst "$burst" \
    latency 20ms
}
