// Two-state models of the ECP5 IO buffers that amaranth's Lattice platform instantiates for
// the ULX3S pins (IB, OB, OBZ, BB), for the pin-level board simulation on Verilator
// (ringkv.sim.board_harness). They follow yosys' ECP5 cell models (share/ecp5/cells_io.vh on
// TRELLIS_IO in common_sim.vh) in every case the board top uses, but do not drive an input
// pad with 'z' (TRELLIS_IO's `assign B = 1'bz` in INPUT mode: Verilator rejects it,
// ASSIGNIN and "tristate in top-level IO"): a pad whose output enable is off (T = 1) reads
// as the level the testbench drives, and an output pad with T = 1 is driven to 1 here
// (a pulled-up line) where the real pad floats.
module IB (input I, output O);
  assign O = I;
endmodule

module OB (input I, output O);
  assign O = I;
endmodule

module OBZ (input I, input T, output O);
  assign O = T ? 1'b1 : I;
endmodule

module BB (input I, input T, output O, inout B);
  assign B = T ? 1'b1 : I;
  assign O = B;
endmodule
