"""What posts a program or a request: the reference executor, the numpy rearrangement,
NIXL direct, prepared and staged; imports the transfer's program and pattern.

numpy and NIXL are imported by these modules only, never by the package."""
