"""VM hosts: qemu VMs booting the distribution's kernel over this machine's root (read-only,
with a throwaway overlay), for a real kernel per host with netem, IFB and Soft-RoCE.

    kernel.py   the guest kernel and busybox: fetched into lossbed's cache (never installed
                on the host), or LOSSBED_VM_KERNEL's
    image.py    build the initramfs from the guest kernel's modules, pick KVM or TCG
    guest.py    runs inside each VM: configures its network, serves the exec channel
    channel.py  the controller's side of the exec channel (virtio-serial, not the network)
    cluster.py  `lossbed up --kind vm`: the VMs, their switch, status, exec, down
"""
