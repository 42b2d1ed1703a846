"""farm: an RL environment farm.

farmd produces honestly scored trajectories for a trainer to learn from. This
package holds the daemon and every service it hosts; see docs/architecture.md for the map.
"""

__version__ = "0.1.0"
