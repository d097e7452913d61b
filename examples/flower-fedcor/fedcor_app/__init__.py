"""FedCor on Fashion-MNIST partitions as a Flower app (fedselect)."""
