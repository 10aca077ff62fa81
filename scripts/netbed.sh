#!/usr/bin/env bash
# netbed.sh — a multi-node test bed on one machine: N "nodes" that are
# network namespaces joined by veth pairs to a bridge, links shaped with tc,
# addresses that exist only inside the namespaces (198.18.0.0/15, set aside
# for network benchmarks, RFC 2544), and Open MPI started across them with an
# rsh agent that enters a namespace instead of ssh.
#
#   scripts/netbed.sh [options] -- COMMAND [ARGS...]
#
# Builds the bed, runs COMMAND inside the first node's namespace, tears the bed
# down (always: also after COMMAND fails or the script is interrupted) and
# exits with COMMAND's status. COMMAND sees:
#   NETBED_MPIRUN   "mpirun" plus the options that start ranks on the bed's
#                   nodes: --host ADDR1:K,ADDR2:K,..., the rsh agent, the TCP
#                   transport and the out-of-band channel restricted to the
#                   bed's subnet, shm (vader) inside a node; append -np and
#                   the program: $NETBED_MPIRUN -np 4 ./prog
#   NETBED_MPI_ARGS the bed's options alone (agent, transports), e.g. for
#                   DT_MPIRUN_ARGS of `dtrain run --nnodes`
#   NETBED_HOSTS    ADDR1:K,ADDR2:K,...      NETBED_ADDRS  ADDR1 ADDR2 ...
#   NETBED_NS       the namespaces, node order  NETBED_SUBNET  e.g. 198.18.7.0/24
#   NETBED_RSH      the rsh agent (NETBED_RSH ADDR CMD runs CMD on that node)
#   NETBED_TAG      this bed's unique tag (every namespace and link name has it)
#   NETBED_BYTES    a script printing one line per node, "I OUT IN": the bytes
#                   node I's link has carried out of and into the node so far
#                   (the tc qdisc counters of both ends: frames with their
#                   Ethernet/IP/TCP headers); run it before and after a
#                   command for the bytes the command sent across each link
#                   (shaped links only: with --rate none there is no qdisc
#                   that counts, and it prints 0)
#
# Options:
#   --nodes N       number of nodes (2; 2..16)
#   --slots K       ranks per node in the host list (2)
#   --rate R        each link's rate, both directions, tc syntax (1gbit;
#                   "none" leaves links unshaped)
#   --delay D       one-way delay added per link, tc syntax (e.g. 100us);
#                   needs the kernel's netem qdisc; where it is missing the
#                   bed says so and runs without the delay
#   --tag-file F    write the tag to F once chosen (for tests that check
#                   teardown)
#   check           (instead of -- COMMAND) only say whether a bed can be
#                   built here: exit 0 if so, 77 with the reason if not
#   leftovers TAG   list namespaces and links whose names contain TAG
#                   (none: exit 0; some: print them, exit 1)
#
# Exit status: COMMAND's; 77 when the machine cannot build a bed (not root,
# no `ip`/`tc`, namespaces refused, e.g. in an unprivileged container) or
# mpirun is missing; 2 for bad usage.
#
# Names: every namespace and interface name carries an 8-character tag
# (random per invocation), so beds built at the same time (parallel ctest
# runs) never collide; addresses live only inside the bed's own namespaces,
# so two beds may even use the same subnet.
set -u

NODES=2
SLOTS=2
RATE=1gbit
DELAY=
TAG_FILE=
MODE=run
LEFT_TAG=

die() { echo "netbed: $*" >&2; exit 2; }
skip() { echo "netbed: skip: $*" >&2; exit 77; }
# need WHAT REASON: skip, unless `make test` installed WHAT (DT_TEST_REQUIRE):
# then a missing piece is a failure, not a skip
need() {
  case " ${DT_TEST_REQUIRE:-} " in
    *" $1 "*) echo "netbed: make test installed $1 (DT_TEST_REQUIRE), yet: $2" >&2; exit 1 ;;
  esac
  skip "$2"
}

while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) [ $# -ge 2 ] || die "--nodes needs a count"; NODES=$2; shift 2 ;;
    --slots) [ $# -ge 2 ] || die "--slots needs a count"; SLOTS=$2; shift 2 ;;
    --rate) [ $# -ge 2 ] || die "--rate needs a rate (1gbit, 10gbit, none)"; RATE=$2; shift 2 ;;
    --delay) [ $# -ge 2 ] || die "--delay needs a time (100us)"; DELAY=$2; shift 2 ;;
    --tag-file) [ $# -ge 2 ] || die "--tag-file needs a path"; TAG_FILE=$2; shift 2 ;;
    check) MODE=check; shift ;;
    leftovers) [ $# -ge 2 ] || die "leftovers needs a tag"; MODE=leftovers; LEFT_TAG=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
case "$NODES" in ''|*[!0-9]*) die "--nodes: '$NODES' is not a count" ;; esac
case "$SLOTS" in ''|*[!0-9]*) die "--slots: '$SLOTS' is not a count" ;; esac
[ "$NODES" -ge 2 ] && [ "$NODES" -le 16 ] || die "--nodes must be in 2..16"
[ "$SLOTS" -ge 1 ] && [ "$SLOTS" -le 64 ] || die "--slots must be in 1..64"

if [ "$MODE" = leftovers ]; then
  out=$( { ip netns list 2>/dev/null; ip -o link show 2>/dev/null; } | grep -F -- "$LEFT_TAG" )
  [ -z "$out" ] && exit 0
  echo "$out"
  exit 1
fi
[ "$MODE" = run ] && [ $# -eq 0 ] && die "missing COMMAND (scripts/netbed.sh [options] -- COMMAND)"

# ---- can a bed be built here? ------------------------------------------------
[ "$(id -u)" -eq 0 ] || skip "needs root (network namespaces and tc)"
command -v ip >/dev/null 2>&1 || need iproute2 "needs 'ip' (iproute2; scripts/deps.sh test)"
command -v tc >/dev/null 2>&1 || need iproute2 "needs 'tc' (iproute2; scripts/deps.sh test)"
[ "$MODE" = check ] || command -v mpirun >/dev/null 2>&1 || need mpi "needs mpirun (openmpi-bin)"

TAG=$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')
[ ${#TAG} -eq 8 ] || TAG=$(printf '%08x' $(( ($$ * 2654435761) & 0xffffffff )))
SW="nb${TAG}sw"
WORK=""
NS=()
CREATED=()   # namespaces created so far (teardown deletes exactly these)

# Beds whose script was SIGKILLed (no trap runs then) are removed by the next
# bed: each bed records its owner (pid and start time) in $STATE/TAG.
STATE=/run/netbed
starttime() { awk '{ print $22 }' "/proc/$1/stat" 2>/dev/null; }
sweep_stale() {
  local f tag pid st ns
  for f in "$STATE"/*; do
    [ -f "$f" ] || continue
    tag=${f##*/}
    read -r pid st < "$f" || continue
    [ -n "$pid" ] && [ "$(starttime "$pid")" = "$st" ] && continue
    for ns in $(ip netns list 2>/dev/null | awk '{ print $1 }' | grep -F "nb${tag}"); do
      for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null; done
      ip netns del "$ns" 2>/dev/null
    done
    rm -f "$f"
    echo "netbed: removed the bed $tag left by a killed run" >&2
  done
}

teardown() {
  local ns pid
  for ns in "${CREATED[@]}"; do
    # Processes left in the bed (orted, ranks) are ours: end them first, so
    # the namespace and its links go away with the delete.
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null; done
  done
  for ns in "${CREATED[@]}"; do ip netns del "$ns" 2>/dev/null; done
  CREATED=()
  if [ "${RUN_NETNS_MOUNTED:-1}" = 0 ] && mountpoint -q /run/netns 2>/dev/null &&
     [ -z "$(ls -A /run/netns 2>/dev/null)" ]; then
    umount /run/netns 2>/dev/null || true
  fi
  rm -f "$STATE/$TAG"
  [ -n "$WORK" ] && rm -rf -- "$WORK"
  WORK=""
}
trap 'rc=$?; trap - EXIT; teardown; exit $rc' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

MKNS_ERR=""
mkns() {
  MKNS_ERR=$(ip netns add "$1" 2>&1) || return 1
  CREATED+=("$1")
  MKNS_ERR=$(ip -n "$1" link set lo up 2>&1)
}

mkdir -p "$STATE" 2>/dev/null
sweep_stale
echo "$$ $(starttime $$)" > "$STATE/$TAG" 2>/dev/null
# `ip netns add` makes /run/netns a mount point (a bind of itself) the first
# time; where that was this bed's doing, teardown undoes it once no
# namespace is left (in a chroot, say, where `ip -n` cannot work and the
# bed is skipped, nothing may stay mounted).
RUN_NETNS_MOUNTED=1
command -v mountpoint >/dev/null 2>&1 && ! mountpoint -q /run/netns 2>/dev/null && RUN_NETNS_MOUNTED=0
if ! mkns "$SW"; then
  skip "cannot create a network namespace here ($(printf '%s' "${MKNS_ERR:-unknown error}" | head -1))"
fi
[ "$MODE" = check ] && exit 0

[ -n "$TAG_FILE" ] && printf '%s\n' "$TAG" > "$TAG_FILE"

# A /24 inside 198.18.0.0/15 picked from the tag (only visible in the bed).
SUB3=$(( 0x${TAG:0:2} ))
SUB2=$(( 18 + (0x${TAG:2:2} & 1) ))
SUBNET="198.${SUB2}.${SUB3}.0/24"
ADDRS=()

shape() { # shape NS DEV: rate (tbf) and delay (netem) on DEV's egress
  local ns=$1 dev=$2
  [ "$RATE" = none ] && [ -z "$DELAY" ] && return 0
  if [ -n "$DELAY" ] && ip netns exec "$ns" tc qdisc add dev "$dev" root handle 1: netem delay "$DELAY" 2>/dev/null; then
    [ "$RATE" = none ] && return 0
    ip netns exec "$ns" tc qdisc add dev "$dev" parent 1:1 handle 10: tbf rate "$RATE" burst 512kb latency 50ms
    return $?
  fi
  if [ -n "$DELAY" ] && [ -z "${NETBED_DELAY_WARNED:-}" ]; then
    echo "netbed: the kernel has no netem qdisc: links get no added delay (--delay $DELAY ignored)" >&2
    NETBED_DELAY_WARNED=1
  fi
  [ "$RATE" = none ] && return 0
  # burst: at least rate/HZ; 512 KiB holds up to ~40 Gbit/s at HZ=1000.
  ip netns exec "$ns" tc qdisc add dev "$dev" root tbf rate "$RATE" burst 512kb latency 50ms
}

build() {
  ip -n "$SW" link add br0 type bridge || return 1
  ip -n "$SW" link set br0 up || return 1
  local i
  for ((i = 0; i < NODES; i++)); do
    local ns="nb${TAG}n$i" a="nb${TAG}a$i" b="nb${TAG}b$i"
    mkns "$ns" || { echo "netbed: cannot create namespace $ns" >&2; return 1; }
    ip link add "$a" type veth peer name "$b" || return 1
    ip link set "$a" netns "$ns" || return 1
    ip link set "$b" netns "$SW" || return 1
    ip -n "$ns" link set "$a" name eth0 || return 1
    local addr="198.${SUB2}.${SUB3}.$((i + 1))"
    ip -n "$ns" addr add "$addr/24" dev eth0 || return 1
    ip -n "$ns" link set eth0 up || return 1
    ip -n "$SW" link set "$b" master br0 || return 1
    ip -n "$SW" link set "$b" up || return 1
    shape "$ns" eth0 || return 1     # node -> switch
    shape "$SW" "$b" || return 1     # switch -> node
    NS+=("$ns")
    ADDRS+=("$addr")
  done
}
if ! build; then
  echo "netbed: building the bed failed (see above)" >&2
  exit 1
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/netbed.$TAG.XXXXXX") || exit 1
MAP="$WORK/hosts"
for ((i = 0; i < NODES; i++)); do printf '%s %s\n' "${ADDRS[$i]}" "${NS[$i]}" >> "$MAP"; done
# Entering a node: its network namespace, and a /dev/shm of its own (as on
# separate machines: every "node" has the same host name, and Open MPI names
# its shared-memory segments after host name and job, so a shared /dev/shm
# lets node 0's and node 1's segments collide and ranks crash). `ip netns
# exec` already gives the command its own mount namespace; the tmpfs lives
# as long as the processes in it.
NODEEXEC="$WORK/nodeexec"
cat > "$NODEEXEC" <<'EOS'
#!/bin/sh
# nodeexec NS COMMAND [ARGS...]
ns=$1; shift
exec ip netns exec "$ns" /bin/sh -c 'mount -t tmpfs -o mode=1777,size=50% netbed-shm /dev/shm && exec "$@"' nodeexec "$@"
EOS
chmod 755 "$NODEEXEC"
# The rsh agent: Open MPI calls it as `AGENT [ssh options] HOST COMMAND...`;
# it runs COMMAND in HOST's namespace.
RSH="$WORK/rsh"
cat > "$RSH" <<EOF
#!/bin/sh
while [ \$# -gt 0 ]; do
  case "\$1" in
    -l|-p|-o|-i|-F) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
host=\$1; shift
ns=\$(awk -v h="\$host" '\$1 == h { print \$2 }' "$MAP")
[ -n "\$ns" ] || { echo "netbed rsh: unknown host '\$host'" >&2; exit 255; }
exec "$NODEEXEC" "\$ns" /bin/sh -c "\$*"
EOF
chmod 755 "$RSH"

# Bytes each link carried: the node's egress (eth0 in the node) and the
# switch's egress towards the node (its port in the switch namespace).
BYTES="$WORK/bytes"
{
  echo '#!/bin/sh'
  echo 'sent() { ip netns exec "$1" tc -s qdisc show dev "$2" | awk '"'"'/Sent/ { print $2; exit }'"'"'; }'
  for ((i = 0; i < NODES; i++)); do
    echo "echo $i \$(sent ${NS[$i]} eth0) \$(sent $SW nb${TAG}b$i)"
  done
} > "$BYTES"
chmod 755 "$BYTES"

HOSTS=""
for a in "${ADDRS[@]}"; do HOSTS="${HOSTS:+$HOSTS,}$a:$SLOTS"; done
ROOTOPT=""
[ "$(id -u)" -eq 0 ] && ROOTOPT="--allow-run-as-root"
MPIARGS="--mca plm_rsh_agent $RSH --mca plm_rsh_no_tree_spawn 1 \
--mca btl tcp,self,vader --mca btl_tcp_if_include $SUBNET --mca oob_tcp_if_include $SUBNET \
--mca orte_keep_fqdn_hostnames 1"
MPIRUN="mpirun $ROOTOPT --host $HOSTS $MPIARGS --bind-to none"

export NETBED_TAG="$TAG" NETBED_HOSTS="$HOSTS" NETBED_ADDRS="${ADDRS[*]}" NETBED_NS="${NS[*]}"
export NETBED_SUBNET="$SUBNET" NETBED_RSH="$RSH" NETBED_MPIRUN="$MPIRUN" NETBED_MPI_ARGS="$MPIARGS"
export NETBED_BYTES="$BYTES"
echo "netbed: $NODES nodes (${NS[*]}), addresses ${ADDRS[*]}, links ${RATE}${DELAY:+ + $DELAY delay}, tag $TAG" >&2

# In the background and waited for, so that a signal runs the trap (and the
# teardown) at once; bash would run it only after a foreground command ends.
# 0<&0 keeps COMMAND's stdin (a background job's default is /dev/null).
"$NODEEXEC" "${NS[0]}" "$@" 0<&0 &
wait $!
