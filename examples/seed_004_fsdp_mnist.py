# Seed 004 ("Fully Sharded Data Parallel(FSDP) 시작하기"), FSDP_mnist.py, run on shardkit:
#
#     python examples/seed_004_fsdp_mnist.py                       # 2 ranks, CPU, gloo
#     SHARDKIT_FMNIST_LIMIT=600 python examples/seed_004_fsdp_mnist.py --epochs 1 --save-model
#
# The seed's code, with only these mechanical changes:
#   torch.distributed.fsdp -> shardkit.fsdp;  "nccl" -> "gloo";  .to(rank) -> .to(DEVICE) (CPU);
#   torch.cuda.set_device(rank) dropped;  torch.cuda.Event(enable_timing=True) -> CPUTimingEvent;
#   cuda_kwargs -> cpu_kwargs without pin_memory;  WORLD_SIZE = torch.cuda.device_count() ->
#   --world-size (default 2);  MASTER_PORT 12355 unless set (so that runs side by side can pick
#   another);  torchvision's MNIST download + transforms -> the vendored Fashion-MNIST files
#   (examples/fsdp_data.py, same format; SHARDKIT_FMNIST_LIMIT=N keeps N images per split).
# The code is otherwise kept as the seed has it, so the linter and formatter leave it alone:
# ruff: noqa
# fmt: off
# 출처: https://github.com/pytorch/examples/blob/master/mnist/main.py
import os
import argparse
import functools
import time
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from fsdp_data import fashion_mnist


from torch.optim.lr_scheduler import StepLR

import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: F401 (as in the seed)
from torch.utils.data.distributed import DistributedSampler
from shardkit.fsdp import FullyShardedDataParallel as FSDP
from shardkit.fsdp.fully_sharded_data_parallel import (  # noqa: F401 (as in the seed)
    CPUOffload,
    BackwardPrefetch,
)
from shardkit.fsdp.wrap import (  # noqa: F401 (as in the seed)
    size_based_auto_wrap_policy,
    enable_wrap,
    wrap,
)

DEVICE = torch.device("cpu")


class CPUTimingEvent:
    """torch.cuda.Event(enable_timing=True) for the CPU: record() and elapsed_time() in ms."""

    def record(self):
        self.time = time.perf_counter()

    def elapsed_time(self, end):
        return (end.time - self.time) * 1000


def setup(rank, world_size):
    os.environ['MASTER_ADDR'] = 'localhost'
    os.environ.setdefault('MASTER_PORT', '12355')

    # initialize the process group
    dist.init_process_group("gloo", rank=rank, world_size=world_size)

def cleanup():
    dist.destroy_process_group()


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):

        x = self.conv1(x)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.relu(x)
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = self.fc1(x)
        x = F.relu(x)
        x = self.dropout2(x)
        x = self.fc2(x)
        output = F.log_softmax(x, dim=1)
        return output


def train(args, model, rank, world_size, train_loader, optimizer, epoch, sampler=None):
    model.train()
    ddp_loss = torch.zeros(2).to(DEVICE)
    if sampler:
        sampler.set_epoch(epoch)
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(DEVICE), target.to(DEVICE)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target, reduction='sum')
        loss.backward()
        optimizer.step()
        ddp_loss[0] += loss.item()
        ddp_loss[1] += len(data)

    dist.all_reduce(ddp_loss, op=dist.ReduceOp.SUM)
    if rank == 0:
        print('Train Epoch: {} \tLoss: {:.6f}'.format(epoch, ddp_loss[0] / ddp_loss[1]))


def test(model, rank, world_size, test_loader):
    model.eval()
    correct = 0
    ddp_loss = torch.zeros(3).to(DEVICE)
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(DEVICE), target.to(DEVICE)
            output = model(data)
            ddp_loss[0] += F.nll_loss(output, target, reduction='sum').item()  # sum up batch loss
            pred = output.argmax(dim=1, keepdim=True)  # get the index of the max log-probability
            ddp_loss[1] += pred.eq(target.view_as(pred)).sum().item()
            ddp_loss[2] += len(data)

    dist.all_reduce(ddp_loss, op=dist.ReduceOp.SUM)

    if rank == 0:
        test_loss = ddp_loss[0] / ddp_loss[2]
        print('Test set: Average loss: {:.4f}, Accuracy: {}/{} ({:.2f}%)\n'.format(
            test_loss, int(ddp_loss[1]), int(ddp_loss[2]),
            1.   * ddp_loss[1] / ddp_loss[2]))


def fsdp_main(rank, world_size, args):
    setup(rank, world_size)

    dataset1 = fashion_mnist('train')
    dataset2 = fashion_mnist('test')

    sampler1 = DistributedSampler(dataset1, rank=rank, num_replicas=world_size, shuffle=True)
    sampler2 = DistributedSampler(dataset2, rank=rank, num_replicas=world_size)

    train_kwargs = {'batch_size': args.batch_size, 'sampler': sampler1}
    test_kwargs = {'batch_size': args.test_batch_size, 'sampler': sampler2}
    cpu_kwargs = {'num_workers': 2,
                    'shuffle': False}
    train_kwargs.update(cpu_kwargs)
    test_kwargs.update(cpu_kwargs)

    train_loader = torch.utils.data.DataLoader(dataset1,**train_kwargs)
    test_loader = torch.utils.data.DataLoader(dataset2, **test_kwargs)
    my_auto_wrap_policy = functools.partial(  # noqa: F841 (as in the seed)
        size_based_auto_wrap_policy, min_num_params=100
    )


    init_start_event = CPUTimingEvent()
    init_end_event = CPUTimingEvent()

    model = Net().to(DEVICE)

    model = FSDP(model)

    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)

    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    init_start_event.record()
    for epoch in range(1, args.epochs + 1):
        train(args, model, rank, world_size, train_loader, optimizer, epoch, sampler=sampler1)
        test(model, rank, world_size, test_loader)
        scheduler.step()

    init_end_event.record()

    if rank == 0:
        print(f"CPU elapsed time: {init_start_event.elapsed_time(init_end_event) / 1000}sec")
        print(f"{model}")

    if args.save_model:
        # 모든 랭크에서 학습이 완료되었는지 확인하기 위해 barrier를 사용합니다.
        dist.barrier()
        states = model.state_dict()
        if rank == 0:
            torch.save(states, "mnist_cnn.pt")

    cleanup()


if __name__ == '__main__':
    # Training settings
    parser = argparse.ArgumentParser(description='PyTorch MNIST Example')
    parser.add_argument('--batch-size', type=int, default=64, metavar='N',
                        help='input batch size for training (default: 64)')
    parser.add_argument('--test-batch-size', type=int, default=1000, metavar='N',
                        help='input batch size for testing (default: 1000)')
    parser.add_argument('--epochs', type=int, default=10, metavar='N',
                        help='number of epochs to train (default: 14)')
    parser.add_argument('--lr', type=float, default=1.0, metavar='LR',
                        help='learning rate (default: 1.0)')
    parser.add_argument('--gamma', type=float, default=0.7, metavar='M',
                        help='Learning rate step gamma (default: 0.7)')
    parser.add_argument('--no-cuda', action='store_true', default=False,
                        help='disables CUDA training')
    parser.add_argument('--seed', type=int, default=1, metavar='S',
                        help='random seed (default: 1)')
    parser.add_argument('--save-model', action='store_true', default=False,
                        help='For Saving the current Model')
    parser.add_argument('--world-size', type=int, default=2, metavar='N',
                        help='number of ranks (the seed uses torch.cuda.device_count())')
    args = parser.parse_args()

    torch.manual_seed(args.seed)

    WORLD_SIZE = args.world_size
    mp.spawn(fsdp_main,
        args=(WORLD_SIZE, args),
        nprocs=WORLD_SIZE,
        join=True)
