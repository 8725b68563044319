"""The lab: tool wrappers, testbed capture, launching, tidy data and charts.

Engine modules (``peercache.*`` outside ``peercache.lab``) never import this
package; the lab drives the engine through ``peercache-bench`` and the public
library API only.
"""
