set -x
# stage 10: CPU seconds per round of every row of the table, in the setting of qp0.2-lr0.02, seed 0, 10 rounds
nice -n 19 env PYTHONPATH=. .venv/bin/python benchmarks/reproductions/hcsfed/recalibrated/hcsfed_row_costs.py --partition dirichlet-qp --alpha 0.2 --lr 0.02 --q 0.1 --rounds 10
nice -n 19 env PYTHONPATH=. .venv/bin/python benchmarks/reproductions/hcsfed/recalibrated/hcsfed_row_costs.py --partition dirichlet-qp --alpha 0.2 --lr 0.02 --q 0.3 0.5 --rounds 10 --rows Random Importance Cluster
