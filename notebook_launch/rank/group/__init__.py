"""The rank in its torch.distributed group: its row says it is joining (``joining``), a rank other than 0 waits
for rank 0's store (``store_wait``), no rank leaves a gloo group its peers are still joining
(``peers_joined``) and DDP's Reducer is never the last owner of a group (``process_groups``).

Owns: joining and leaving process groups safely. May import: the rank's core tools (``after_import``),
record's formats, wire, errors; never the notebook side or an engine.
"""
