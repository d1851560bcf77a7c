# Causal attention forward+backward on one CPU thread at the quickstart's
# sizes (B 8, heads 4, T 64, head dim 32), PyTorch's scaled_dot_product_attention
# against the explicit core the engine runs on the CPU (baddbmm with the
# causal mask, softmax, bmm), interleaved twice, same wheel as the engine.
#   $DTRAIN_VENV/bin/python bench/sdpa_cpu.py   -> prints ms per fwd+bwd and the max difference
import torch, time, torch.nn.functional as F
torch.set_num_threads(1)
B, H, T, D = 8, 4, 64, 32
q=torch.randn(B*H,T,D,requires_grad=True); k=torch.randn(B*H,T,D,requires_grad=True); v=torch.randn(B*H,T,D,requires_grad=True)
mask=torch.full((T,T),float('-inf')).triu(1)
def naive():
    s=torch.baddbmm(mask, q, k.transpose(1,2), alpha=D**-0.5)
    return torch.bmm(s.softmax(-1), v)
def sdpa():
    return F.scaled_dot_product_attention(q.view(B,H,T,D),k.view(B,H,T,D),v.view(B,H,T,D),is_causal=True)
for name,f in [("naive",naive),("sdpa",sdpa),("naive",naive),("sdpa",sdpa)]:
    for _ in range(20): f().sum().backward()
    t=time.perf_counter(); n=200
    for _ in range(n): f().sum().backward()
    print(name, (time.perf_counter()-t)/n*1e3, "ms fwd+bwd")
print("maxdiff", (naive()-sdpa().view(B*H,T,D)).abs().max().item())
