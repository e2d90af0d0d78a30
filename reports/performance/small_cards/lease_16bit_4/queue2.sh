cd /root/w; export CUDA_VISIBLE_DEVICES=2
echo "== $(date +%T) python3 -m assignment.trainer --config configs/gsm8k_qwen_coder_16gb.yaml --impl solutions/exercises.py train.output_dir=/root/r/16gb train.time_limit_s=null train.final_checkpoint=false "; python3 -m assignment.trainer --config configs/gsm8k_qwen_coder_16gb.yaml --impl solutions/exercises.py train.output_dir=/root/r/16gb train.time_limit_s=null train.final_checkpoint=false ; echo "== rc $?"
touch /root/r/done2
