"""Building what Core serves: the Pyodide runtime with our wheels and lock, the page's memory
snapshot, the JupyterLite site (CPython only).

Core imports this package for what it provisions on first use and for the snapshot's files
it serves; this package never imports Core. Pages never import it either: the page's copy
of our wheel leaves it out (:mod:`.own_wheel`).
"""
