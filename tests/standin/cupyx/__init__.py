"""``cupyx`` on the stand-in: what vmem uses of it (``cupyx.scipy.special.erf``)."""
