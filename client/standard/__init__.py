"""The Python Array API standard's functions, one module per category of the standard (the
layout of array_api_strict), and its two extensions, ``linalg`` and ``fft``.

Each category is a mixin class of :class:`~client.namespace.Namespace`: static methods, and
methods where a function needs the namespace's default device (``self.device``). They build
ops with the core in ``client.array``, below them; ``client.namespace`` above assembles them.
"""
