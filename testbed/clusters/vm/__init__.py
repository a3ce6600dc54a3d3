"""VM hosts: qemu VMs booting the distribution's kernel over this machine's root (read-only,
with a throwaway overlay), for a real kernel per host with netem, IFB and Soft-RoCE.

    image.py    find the kernel and its modules, build the initramfs, pick KVM or TCG
    guest.py    runs inside each VM: configures its network, serves the exec channel
    channel.py  the controller's side of the exec channel (virtio-serial, not the network)
    cluster.py  `lossbed up --kind vm`: the VMs, their switch, status, exec, down
"""
