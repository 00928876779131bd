"""Floor 3, the plugin machinery: the plugin manager (entry points, plugin files, load errors), the component
registry (names, collisions, provenance) and the hook specifications. Imports ``api`` and ``services``."""
