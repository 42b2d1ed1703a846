"""Atropos's side of farm: the queue of scored groups Atropos environments push and Atropos trainers take
batches from (``queue``), cut as atroposlib 0.4.0 cuts them (``batching``), checked before they are kept
(``groups``). Its HTTP edge is ``farmd.api.atropos``; its rows are the store's (``store.atropos``)."""
