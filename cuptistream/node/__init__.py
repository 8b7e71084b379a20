"""The node install: every Python process of an environment probed, without wrapping its command.

``cuptistream node install --python PATH`` prepares, once per interpreter ABI, a folder with the
probe and the packages it imports (``runtime``), and puts a one-line ``.pth`` file into the
environment's site-packages (``hook``). The line does nothing unless the node config file
(``/etc/cuptistream/node.yaml``) exists; then it arms the probe's trigger, which starts a probe fed
to the node collector when the process first initializes CUDA. ``status`` says what is installed
where and whether the collector is reachable (``health``); ``uninstall`` removes what install added.
"""
