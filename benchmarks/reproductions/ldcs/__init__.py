"""FedLDCS (Hou and Kong, FedKDD 2024): Table 1 on Fashion-MNIST."""
