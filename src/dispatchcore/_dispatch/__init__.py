"""How a call is split and gathered: modes, ``@register``, typed descriptors, built-in and nd modes,
futures, the call context.

The decorator layer names the driver's bound method through a protocol
(``BoundMethod``), never the group layer's ``MethodProxy``.
"""
