#!/bin/busybox sh
# Stage 1 of the PeerCache guest, /init of its initramfs (busybox only).
# Loads the modules, mounts the host's / read-only over virtio-9p with a tmpfs
# overlay on top and the run's control folder (a read-write 9p share), then
# switch_roots into that tree to run stage 2 (which mounts the work folder).
# Any failure powers the guest off; the host runner then reports it.
/bin/busybox mkdir -p /usr/bin /sbin /usr/sbin
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin

die() { echo "pcguest: stage 1: $*"; poweroff -f; sleep 5; }

mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev

while read -r m; do
  insmod "/modules/$m.ko" 2>/tmp/insmod.err || { grep -q 'File exists' /tmp/insmod.err || die "insmod $m: $(cat /tmp/insmod.err)"; }
done < /modules/order

P9="trans=virtio,version=9p2000.L,msize=524288,cache=loose"
mount -t 9p -o "$P9,ro" host /lower || die "cannot mount the host's / (9p tag 'host')"
mount -t tmpfs -o size=1g,mode=0755 rw /rw || die "cannot mount the overlay's tmpfs"
mkdir -p /rw/upper /rw/work
mount -t overlay overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work /newroot \
  || die "cannot mount the overlay root"
mkdir -p /newroot/mnt/pcguest
mount -t 9p -o "trans=virtio,version=9p2000.L,msize=524288" ctl /newroot/mnt/pcguest \
  || die "cannot mount the control share (9p tag 'ctl')"
mount --move /dev /newroot/dev
umount /proc /sys 2>/dev/null
exec switch_root /newroot /bin/sh /mnt/pcguest/stage2.sh
