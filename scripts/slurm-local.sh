#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for `mmulab sweep --backend
# slurm` and its tests: munged, slurmctld and slurmd on localhost, with
# this machine's CPUs and memory as one node in one partition (`local`).
#
# Debian's slurm-wlm (Slurm 22.05) and munge; run as root. It installs
# them when missing, writes /etc/slurm/slurm.conf (only if that file is
# absent or was written by this script), starts the three daemons when
# they are not running, and waits until `sinfo` shows the node idle.
#
#   scripts/slurm-local.sh          set up and start (idempotent)
#   scripts/slurm-local.sh stop     stop the daemons this set-up runs
#
# On a real cluster none of this is needed: point `--backend slurm` at it
# with --slurm-arg (docs/sweeps.md).
set -euo pipefail

MARK="# written by mmulab scripts/slurm-local.sh"
CONF=/etc/slurm/slurm.conf
NODE=$(hostname -s)

die() { echo "slurm-local: $*" >&2; exit 1; }

stop() {
  # Only the daemons' own pid files: never a broad kill by name.
  for f in /run/slurmd.pid /run/slurmctld.pid /run/munge/munged.pid; do
    if [[ -s $f ]]; then
      kill "$(cat "$f")" 2>/dev/null || true
    fi
  done
}

if [[ ${1:-} == stop ]]; then
  stop
  exit 0
fi

[[ $(id -u) == 0 ]] || die "run as root (the daemons and /etc/slurm need it)"

if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  echo "slurm-local: installing slurm-wlm and munge (Debian packages)" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
fi

# munge: a 1,024-byte key owned by munge, mode 0400. As root, munged
# refuses the ownership of /var/log/munge unless started with --force.
if [[ ! -s /etc/munge/munge.key ]]; then
  dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
chown munge:munge /etc/munge/munge.key
chmod 0400 /etc/munge/munge.key
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  munged --force
  for _ in $(seq 50); do
    munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break
    sleep 0.1
  done
  munge -n | unmunge >/dev/null 2>&1 || die "munged did not start (see /var/log/munge/munged.log)"
fi

if [[ -e $CONF ]] && ! grep -qF "$MARK" "$CONF"; then
  die "$CONF exists and was not written by this script; not touching it"
fi
CPUS=$(nproc)
# A little under the machine's memory, so that slurmd's check passes.
MEM_MB=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 9 / 10 ))
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
cat > "$CONF.new" <<EOF
$MARK
ClusterName=mmulab-local
SlurmctldHost=$NODE
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
# No cgroups here: track processes by their parents, bind no tasks.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
# A test cluster: start array tasks as soon as CPUs free up (the 3 s
# default batches submissions for busy production controllers).
SchedulerParameters=batch_sched_delay=0
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
MaxArraySize=100001
NodeName=$NODE CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
PartitionName=local Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
changed=1
cmp -s "$CONF.new" "$CONF" && changed=0
mv "$CONF.new" "$CONF"

running() { [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }
if running /run/slurmctld.pid; then
  # Running daemons read a changed slurm.conf only when told to.
  [[ $changed == 0 ]] || scontrol reconfigure
else
  slurmctld
fi
running /run/slurmd.pid || slurmd

state=""
for _ in $(seq 100); do
  state=$(sinfo -h -n "$NODE" -o %T 2>/dev/null || true)
  case $state in
    idle*|mixed*|allocated*) break ;;
    down*|drain*) scontrol update nodename="$NODE" state=resume 2>/dev/null || true ;;
  esac
  sleep 0.2
done
case $state in
  idle*|mixed*|allocated*) echo "slurm-local: node $NODE $state ($CPUS CPUs, partition local)" ;;
  *) die "the node is '${state:-unknown}' after 20 s (see /var/log/slurm/)" ;;
esac
