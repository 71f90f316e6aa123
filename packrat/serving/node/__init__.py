"""Several models on one machine: their engines agree on one plan of cores, with no service to run.

Every engine whose CPU budget is the same set of cores shares a *node directory* (under
NODE_DIR_ENV, default /tmp/packrat-node-UID, one folder per core set; files.py says what is in it).
Each engine is a member (member.py): it beats, reports its load (load.py) and applies its own part
of the node plan; the member holding the owner's lease plans for all (owner.py), with the pure
node planner (planning/node.py).
"""

from packrat.serving.node.files import node_dir, read_state
from packrat.serving.node.load import LoadMeter
from packrat.serving.node.member import NodeMember
from packrat.serving.node.owner import NodeOwner

__all__ = ["LoadMeter", "NodeMember", "NodeOwner", "node_dir", "read_state"]
