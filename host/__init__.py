"""``ringkv.host`` (folder ``host/``): host driver, scheduler, numpy model and golden models.

It may import the standard library, numpy, pyserial and ``ringkv.defs``, never ``ringkv.hw``:
the host knows the device only through the protocol, and every golden model is an independent
implementation of what the gateware does.
"""
