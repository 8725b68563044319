#!/bin/sh
# Stage 2 of the PeerCache guest: runs in the host's own tree (overlay over
# the read-only 9p root), so the host's Python, venv and tools are all here.
# Mounts what programs expect, builds the RDMA topology (topology.sh, made by
# the host runner), runs the one command (command.sh) in the work folder,
# writes its exit status to rc, and powers the guest off on every path.
ctl=/mnt/pcguest
finish() {
  echo "$1" > "$ctl/rc.tmp" && mv "$ctl/rc.tmp" "$ctl/rc"
  sync
  echo "pcguest: powering off (status $1)"
  poweroff -f 2>/dev/null || echo o > /proc/sysrq-trigger
  sleep 10
}

mount -t proc proc /proc
mount -t sysfs sys /sys
mkdir -p /dev/shm /dev/pts
mount -t tmpfs -o mode=1777,size=2g shm /dev/shm
mount -t devpts -o gid=5,mode=620 devpts /dev/pts
mount -t tmpfs -o mode=0755 run /run
mkdir -p /run/netns /run/lock /var/tmp
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
# A cgroup2 tree, as programs that read their limits expect one.
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
ip link set lo up
ulimit -l unlimited          # registered memory: RDMA pins pages
ulimit -n 65536

. "$ctl/env.sh" || finish 125
# A fresh /tmp, unless the host's must stay visible (two machines: a checkout under /tmp is
# their shared install; their writes still land in the overlay, never on the host).
[ -n "$PCG_HOST_TMP" ] || mount -t tmpfs -o mode=1777,size=1g tmp /tmp
hostname "${PCG_HOSTNAME:-pcguest}"
# The work folder (read-write, same path as on the host), mounted after /tmp and
# /run so a folder under them is not hidden by their tmpfs.
# Its read-mostly folders (PCG_CACHED: the venv and the package, relative to it) are then shown
# through the cached read-only root instead, seen at /run/pcg-root (a bind of the root alone, so
# without the tmpfs on /tmp that hides a work folder under it): each Python start reads hundreds of
# files there, a 9p round trip each over the uncached share.
if [ -n "$PCG_WORK" ]; then
  mkdir -p "$PCG_WORK"
  if [ -n "$PCG_CACHED" ]; then mkdir -p /run/pcg-root && mount --bind / /run/pcg-root; fi
  mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288 work "$PCG_WORK" \
    || { echo "pcguest: cannot mount the work folder $PCG_WORK (9p tag 'work')"; finish 126; }
  for d in $PCG_CACHED; do
    if [ -d "/run/pcg-root$PCG_WORK/$d" ] && mount --bind "/run/pcg-root$PCG_WORK/$d" "$PCG_WORK/$d"; then
      echo "pcguest: $d read through the cached root"
    else
      echo "pcguest: $d read over the work share (no cached copy)"
    fi
  done
fi
guest_calib=$("$PCG_PYTHON" -c "$PCG_CALIB_CODE")
export PEERCACHE_SLOWNESS=$(awk -v g="$guest_calib" -v h="$PCG_HOST_CALIB" 'BEGIN{f=g/h; if (f<1) f=1; printf "%.1f", f}')
echo "$PEERCACHE_SLOWNESS" > "$ctl/slowness"
echo "pcguest: kernel $(uname -r), $(nproc) CPUs, $(awk '/MemTotal/{print int($2/1024)}' /proc/meminfo) MiB, slowness x$PEERCACHE_SLOWNESS"
sh "$ctl/topology.sh" || { echo "pcguest: building the RDMA topology failed"; finish 124; }
echo "pcguest: ready"
cd "$PCG_CWD" || finish 126
# Through a pipe, so the command's output is not a terminal (no colour codes or
# progress redraws on the console); its status comes back through a file.
{ sh "$ctl/command.sh" </dev/null 2>&1; echo $? > /tmp/pcguest.rc; } | cat
finish "$(cat /tmp/pcguest.rc 2>/dev/null || echo 125)"
