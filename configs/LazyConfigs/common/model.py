"""Mask R-CNN on a LambdaResNet + FPN, as the yaml recipes build it (Base-RCNN-FPN.yaml and
Base-Paper-MaskRCNN-LSJ.yaml): detectron2's defaults, plus the paper's from-scratch choices
(synchronized BN everywhere, nothing frozen, a 4conv1fc box head).

The variants set model.backbone.bottom_up's depth, placement and se. The FPN width reaches the
heads by interpolation, so model.backbone.out_channels alone changes it.
"""

from detectron2.config import LazyCall as L
from detectron2.layers import ShapeSpec
from detectron2.modeling import FPN, GeneralizedRCNN
from detectron2.modeling.anchor_generator import DefaultAnchorGenerator
from detectron2.modeling.backbone.fpn import LastLevelMaxPool
from detectron2.modeling.box_regression import Box2BoxTransform
from detectron2.modeling.matcher import Matcher
from detectron2.modeling.poolers import ROIPooler
from detectron2.modeling.proposal_generator import RPN, StandardRPNHead
from detectron2.modeling.roi_heads import (
    FastRCNNConvFCHead,
    FastRCNNOutputLayers,
    MaskRCNNConvUpsampleHead,
    StandardROIHeads,
)

from lambda_det.modeling import LambdaResNetBackbone
from lambda_det.modeling.mixers import mixer_option_defaults

FPN_CHANNELS = "${model.backbone.out_channels}"
FPN_SCALES = (1.0 / 4, 1.0 / 8, 1.0 / 16, 1.0 / 32)  # p2..p5, where the RoI heads pool

model = L(GeneralizedRCNN)(
    backbone=L(FPN)(
        bottom_up=L(LambdaResNetBackbone)(
            depth=50,
            placement="paper",  # Table 19: listed c4 blocks and all of c5; "none": ResNet-RS
            se=False,
            out_features=["res2", "res3", "res4", "res5"],
            norm="SyncBN",
            freeze_at=0,  # from scratch: everything trains
            width_multiplier=1.0,
            in_channels=3,
            drop_path_rate=0.0,  # stochastic depth: none in the paper's detection recipe
            mixer="lambda",
            # The lambda mixer's options at their defaults (the LambdaLayer's): heads, dim_k,
            # dim_u, scope (None: global context, over feature maps up to max_size), impl,
            # max_size, share_position_embeddings. lambda_det.modeling.use_mixer puts another
            # mixer in their place (see aft_conv_r101_mask_rcnn.py).
            **mixer_option_defaults("lambda"),
        ),
        in_features=["res2", "res3", "res4", "res5"],
        out_channels=256,
        norm="SyncBN",
        top_block=L(LastLevelMaxPool)(),
        fuse_type="sum",
    ),
    proposal_generator=L(RPN)(
        in_features=["p2", "p3", "p4", "p5", "p6"],
        head=L(StandardRPNHead)(in_channels=FPN_CHANNELS, num_anchors=3, conv_dims=[-1]),
        anchor_generator=L(DefaultAnchorGenerator)(
            sizes=[[32], [64], [128], [256], [512]],  # one size per FPN level
            aspect_ratios=[[0.5, 1.0, 2.0]],
            strides=[4, 8, 16, 32, 64],
            offset=0.0,
        ),
        anchor_matcher=L(Matcher)(
            thresholds=[0.3, 0.7], labels=[0, -1, 1], allow_low_quality_matches=True
        ),
        box2box_transform=L(Box2BoxTransform)(weights=[1.0, 1.0, 1.0, 1.0]),
        batch_size_per_image=256,
        positive_fraction=0.5,
        pre_nms_topk=[2000, 1000],  # (training, test), per FPN level
        post_nms_topk=[1000, 1000],
        nms_thresh=0.7,
    ),
    roi_heads=L(StandardROIHeads)(
        num_classes=80,
        batch_size_per_image=512,
        positive_fraction=0.25,
        proposal_matcher=L(Matcher)(
            thresholds=[0.5], labels=[0, 1], allow_low_quality_matches=False
        ),
        box_in_features=["p2", "p3", "p4", "p5"],
        box_pooler=L(ROIPooler)(
            output_size=7, scales=FPN_SCALES, sampling_ratio=0, pooler_type="ROIAlignV2"
        ),
        box_head=L(FastRCNNConvFCHead)(
            input_shape=L(ShapeSpec)(channels=FPN_CHANNELS, height=7, width=7),
            conv_dims=[256, 256, 256, 256],
            fc_dims=[1024],
            conv_norm="naiveSyncBN_N",  # tolerates images with no sampled boxes
        ),
        box_predictor=L(FastRCNNOutputLayers)(
            input_shape=L(ShapeSpec)(channels=1024),  # box_head's last fc
            box2box_transform=L(Box2BoxTransform)(weights=[10.0, 10.0, 5.0, 5.0]),
            num_classes="${..num_classes}",
            test_score_thresh=0.05,
            test_nms_thresh=0.5,
            test_topk_per_image=100,
            loss_weight={"loss_box_reg": 1.0},  # loss_cls: 1.0 unless given
        ),
        mask_in_features=["p2", "p3", "p4", "p5"],
        mask_pooler=L(ROIPooler)(
            output_size=14, scales=FPN_SCALES, sampling_ratio=0, pooler_type="ROIAlignV2"
        ),
        mask_head=L(MaskRCNNConvUpsampleHead)(
            input_shape=L(ShapeSpec)(channels=FPN_CHANNELS, height=14, width=14),
            num_classes="${..num_classes}",
            conv_dims=[256, 256, 256, 256, 256],  # four convs, then the deconv
            conv_norm="naiveSyncBN_N",
        ),
    ),
    pixel_mean=[103.530, 116.280, 123.675],
    pixel_std=[1.0, 1.0, 1.0],
    input_format="BGR",
)
