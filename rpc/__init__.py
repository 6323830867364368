"""gRPC plumbing shared by Vigil's servers and clients: errors, server bootstrap, channels."""
