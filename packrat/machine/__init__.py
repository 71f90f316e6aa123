"""The machine: its cores and sockets, the CPU model, and the CPU budget a server may plan for."""
