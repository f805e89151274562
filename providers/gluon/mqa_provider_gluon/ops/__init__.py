"""Triton kernels of the gluon provider, one op per module; nothing imports triton until used."""
