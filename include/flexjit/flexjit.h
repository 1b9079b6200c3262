// flexjit: everything a user includes.
#pragma once

#include <flexjit/attention.h>
#include <flexjit/backward.h>
#include <flexjit/block_mask.h>
#include <flexjit/context.h>
#include <flexjit/context_parallel.h>
#include <flexjit/cpu.h>
#include <flexjit/device_block_mask.h>
#include <flexjit/device_tensor.h>
#include <flexjit/dsl.h>
#include <flexjit/error.h>
#include <flexjit/expr.h>
#include <flexjit/kernel.h>
#include <flexjit/mods.h>
#include <flexjit/paged_kv.h>
#include <flexjit/tensor.h>
#include <flexjit/types.h>
