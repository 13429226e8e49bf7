"""Two CNNs shaped like the detectors users bring, exported to ONNX with random weights.

`ocr_det`: a DBNet-style text detector (ResNet-18 backbone, FPN neck, upsampling head),
1x3x480x640. `yolo_det`: a YOLOv8n-style object detector (Conv-BN-SiLU, C2f blocks, SPPF, PAN
neck, decoupled heads with the DFL softmax), 1x3x640x640. Needs torch and torchvision (the GPU
machine's image has both); usage: python3 gpu/cnn_models.py OUT_DIR
"""

import os
import sys

import torch
from torch import nn
import torchvision


def conv(c1, c2, k=1, s=1):
    return nn.Sequential(nn.Conv2d(c1, c2, k, s, k // 2, bias=False), nn.BatchNorm2d(c2), nn.SiLU())


class Bottleneck(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.a, self.b = conv(c, c, 3), conv(c, c, 3)

    def forward(self, x):
        return x + self.b(self.a(x))


class C2f(nn.Module):
    def __init__(self, c1, c2, n):
        super().__init__()
        self.c = c2 // 2
        self.cv1 = conv(c1, 2 * self.c)
        self.cv2 = conv((2 + n) * self.c, c2)
        self.m = nn.ModuleList(Bottleneck(self.c) for _ in range(n))

    def forward(self, x):
        y = list(self.cv1(x).chunk(2, 1))
        for m in self.m:
            y.append(m(y[-1]))
        return self.cv2(torch.cat(y, 1))


class SPPF(nn.Module):
    def __init__(self, c1, c2):
        super().__init__()
        self.cv1, self.cv2 = conv(c1, c1 // 2), conv(c1 * 2, c2)
        self.pool = nn.MaxPool2d(5, 1, 2)

    def forward(self, x):
        y = [self.cv1(x)]
        for _ in range(3):
            y.append(self.pool(y[-1]))
        return self.cv2(torch.cat(y, 1))


class Yolo(nn.Module):
    def __init__(self, classes=80, reg=16):
        super().__init__()
        self.reg = reg
        self.b1 = nn.Sequential(conv(3, 16, 3, 2), conv(16, 32, 3, 2), C2f(32, 32, 1), conv(32, 64, 3, 2), C2f(64, 64, 2))
        self.b2 = nn.Sequential(conv(64, 128, 3, 2), C2f(128, 128, 2))
        self.b3 = nn.Sequential(conv(128, 256, 3, 2), C2f(256, 256, 1), SPPF(256, 256))
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.n1, self.n2 = C2f(384, 128, 1), C2f(192, 64, 1)
        self.d1, self.n3 = conv(64, 64, 3, 2), C2f(192, 128, 1)
        self.d2, self.n4 = conv(128, 128, 3, 2), C2f(384, 256, 1)
        self.box = nn.ModuleList(
            nn.Sequential(conv(c, 64, 3), conv(64, 64, 3), nn.Conv2d(64, 4 * reg, 1)) for c in (64, 128, 256))
        self.cls = nn.ModuleList(
            nn.Sequential(conv(c, 80, 3), conv(80, 80, 3), nn.Conv2d(80, classes, 1)) for c in (64, 128, 256))
        self.dfl = nn.Conv2d(reg, 1, 1, bias=False)
        self.dfl.weight.data[:] = torch.arange(reg, dtype=torch.float32).view(1, reg, 1, 1)

    def forward(self, x):
        p3 = self.b1(x)
        p4 = self.b2(p3)
        p5 = self.b3(p4)
        h4 = self.n1(torch.cat([self.up(p5), p4], 1))
        o3 = self.n2(torch.cat([self.up(h4), p3], 1))
        o4 = self.n3(torch.cat([self.d1(o3), h4], 1))
        o5 = self.n4(torch.cat([self.d2(o4), p5], 1))
        boxes, scores = [], []
        for i, o in enumerate((o3, o4, o5)):
            boxes.append(self.box[i](o).flatten(2))
            scores.append(self.cls[i](o).flatten(2))
        box = torch.cat(boxes, 2)
        b, _, a = box.shape
        dist = self.dfl(box.view(b, 4, self.reg, a).transpose(2, 1).softmax(1)).view(b, 4, a)
        return torch.cat([dist, torch.cat(scores, 2).sigmoid()], 1)


class DBNet(nn.Module):
    def __init__(self):
        super().__init__()
        r = torchvision.models.resnet18(weights=None)
        self.stem = nn.Sequential(r.conv1, r.bn1, r.relu, r.maxpool)
        self.layers = nn.ModuleList([r.layer1, r.layer2, r.layer3, r.layer4])
        self.lat = nn.ModuleList(nn.Conv2d(c, 256, 1, bias=False) for c in (64, 128, 256, 512))
        self.out = nn.ModuleList(nn.Conv2d(256, 64, 3, padding=1, bias=False) for _ in range(4))
        self.head = nn.Sequential(
            nn.Conv2d(256, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
            nn.ConvTranspose2d(64, 64, 2, 2), nn.BatchNorm2d(64), nn.ReLU(),
            nn.ConvTranspose2d(64, 1, 2, 2), nn.Sigmoid())

    def forward(self, x):
        x = self.stem(x)
        feats = []
        for layer in self.layers:
            x = layer(x)
            feats.append(x)
        lat = [l(f) for l, f in zip(self.lat, feats)]
        for i in (2, 1, 0):
            lat[i] = lat[i] + nn.functional.interpolate(lat[i + 1], scale_factor=2.0, mode="nearest")
        outs = [o(l) for o, l in zip(self.out, lat)]
        outs = [outs[0]] + [nn.functional.interpolate(o, scale_factor=2.0 ** i, mode="nearest")
                            for i, o in enumerate(outs[1:], 1)]
        return self.head(torch.cat(outs, 1))


def export(model, shape, path):
    model.eval()
    torch.manual_seed(0)
    for m in model.modules():  # BatchNorm statistics that are not the identity
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    x = torch.rand(*shape)
    with torch.no_grad():
        try:  # the TorchScript exporter (opset 17); the dynamo one where it is gone
            torch.onnx.export(model, (x,), path, opset_version=17, input_names=["x"], output_names=["y"],
                              dynamo=False)
        except Exception as e:  # noqa: BLE001
            print("TorchScript export failed:", e, "- trying dynamo=True")
            torch.onnx.export(model, (x,), path, opset_version=18, input_names=["x"], output_names=["y"],
                              dynamo=True, external_data=False)
    print("wrote", path, shape)


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    export(DBNet(), (1, 3, 480, 640), os.path.join(out, "ocr_det.onnx"))
    export(Yolo(), (1, 3, 640, 640), os.path.join(out, "yolo_det.onnx"))
